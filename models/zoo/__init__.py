"""Registered architectures. Importing this package registers every model."""

from . import densenet, efficientnet, plain_cnns, resnet

__all__ = ["densenet", "efficientnet", "plain_cnns", "resnet"]
