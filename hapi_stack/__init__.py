"""A local OpenStack Swift all-in-one (plus, optionally, the HAPI server) for development.

::

    from hapi_stack import StackConfig, up, down

    stack = up(StackConfig(state_dir=Path(".hapi")))
    conn = stack.connection()              # the admin, test:tester
    conn.put_container("data")
    down(stack.config)

Processes are recorded with their start times in ``STATE_DIR/pids.json`` and stopped by PID only.
``up`` on a partly stopped stack (a service crashed or was killed) starts only the services that
are down and keeps the others, memcached's tokens included, running.
"""

from hapi_stack._config import (
    ADMIN_USER,
    OTHER_USER,
    PORT_SETTINGS,
    PUBLIC_PORT_SETTINGS,
    WILDCARD_HOST,
    StackConfig,
    SwiftUser,
    default_advertise_host,
)
from hapi_stack._files import HAPI_FILTER, PROXY_PIPELINE, proxy_filters, render_proxy_conf
from hapi_stack._ports import pick_free_ports, port_in_use
from hapi_stack._record import ServiceProcess
from hapi_stack._services import ServiceSpec, stack_services
from hapi_stack._stack import (
    RunningStack,
    ServiceStatus,
    StackStatus,
    down,
    running_stack,
    status,
    up,
)
from hapi_stack._threads import (
    HOST_ALLOCATOR,
    SHARED_HOST_ENV,
    SHARED_HOST_THREADS,
    shared_host_env,
)
from hapi_stack.errors import (
    MissingBinaryError,
    PortInUseError,
    StackError,
    StackNotRunningError,
    StackStartError,
)

__all__ = [
    "ADMIN_USER",
    "HAPI_FILTER",
    "OTHER_USER",
    "PORT_SETTINGS",
    "PROXY_PIPELINE",
    "PUBLIC_PORT_SETTINGS",
    "HOST_ALLOCATOR",
    "SHARED_HOST_ENV",
    "SHARED_HOST_THREADS",
    "WILDCARD_HOST",
    "MissingBinaryError",
    "PortInUseError",
    "RunningStack",
    "ServiceProcess",
    "ServiceSpec",
    "ServiceStatus",
    "StackConfig",
    "StackError",
    "StackNotRunningError",
    "StackStartError",
    "StackStatus",
    "SwiftUser",
    "default_advertise_host",
    "down",
    "pick_free_ports",
    "port_in_use",
    "proxy_filters",
    "render_proxy_conf",
    "running_stack",
    "shared_host_env",
    "stack_services",
    "status",
    "up",
]
