"""``python -m hapi_bench.agent_main``: the storage-side agent, run inside its own namespace."""

import sys

from hapi_bench.agent import main

sys.exit(main())
