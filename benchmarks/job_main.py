"""``python -m hapi_bench.job_main SPEC.json``: a benchmark or demo job inside its own namespace."""

import sys

from hapi_bench.testbed import isolated_main

sys.exit(isolated_main(sys.argv[1:]))
