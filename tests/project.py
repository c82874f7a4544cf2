"""The project's packages: import name -> folder (two live in folders of another name).

One list for the tests that walk the whole project (citations, exception names, the import map).
"""

from __future__ import annotations

PACKAGES: dict[str, str] = {
    "hapi_contract": "hapi_contract",
    "hapi_models": "models",
    "hapi_core": "hapi_core",
    "hapi_server": "hapi_server",
    "swift_middleware": "swift_middleware",
    "hapi_client": "hapi_client",
    "hapi_stack": "hapi_stack",
    "hapi_bench": "benchmarks",
    "hapi_cli": "hapi_cli",
}
