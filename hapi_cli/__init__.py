"""The ``hapi`` command line; the entry point is :func:`hapi_cli.main.main`.

Nothing is re-exported here: ``from hapi_cli.main import main`` in this file would rebind the
attribute ``hapi_cli.main`` from the module to the function and confuse dotted look-ups.
"""

__all__: list[str] = []
