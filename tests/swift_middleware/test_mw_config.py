"""The filter's options as paste hands them over: strings, checked once at proxy start."""

from __future__ import annotations

import textwrap
from enum import StrEnum

import pytest

from hapi_core.settings import CoreSettings
from swift_middleware import Execution, FilterConfig, FilterConfigError, middleware
from swift_middleware.config import IN_PROXY_OPTIONS, PROXY_DEFAULTS


def test_defaults_need_only_the_servers() -> None:
    config = FilterConfig.from_conf({"hapi_servers": "http://127.0.0.1:8090"})
    assert config.execution is Execution.DECOUPLED
    assert config.hapi_servers == ["http://127.0.0.1:8090"]
    assert config.swift_url is None
    assert config.max_body_bytes == 1024 * 1024
    assert (config.health_check_interval, config.conn_timeout, config.node_timeout) == (5, 5, 600)


def test_strings_are_parsed_and_server_lists_split_on_commas_or_spaces() -> None:
    config = FilterConfig.from_conf(
        {
            "hapi_servers": "http://a:8090, http://b:8090  https://c",
            "swift_url": "http://swift:8080/",
            "max_body_bytes": "4096",
            "health_check_interval": "0.5",
            "torch_threads": "",
            "use": "egg:hapi#hapi",
            "log_level": "DEBUG",
            "__name__": "hapi",
        }
    )
    assert config.hapi_servers == ["http://a:8090", "http://b:8090", "https://c"]
    assert config.swift_url == "http://swift:8080"
    assert config.max_body_bytes == 4096 and config.health_check_interval == 0.5
    assert config.core_settings().torch_threads is None


def test_in_proxy_needs_no_servers() -> None:
    config = FilterConfig.from_conf(
        {"execution": "in_proxy", "device": "cuda:1", "torch_threads": "3"}
    )
    assert config.execution is Execution.IN_PROXY
    assert (config.device, config.core_settings().torch_threads) == ("cuda:1", 3)
    assert config.core_settings().devices == "cuda:1"


def test_count_process_memory_defaults_on_and_reaches_the_core() -> None:
    """The proxy's own resident memory counts against the budget unless the option says not."""
    default = FilterConfig.from_conf({"execution": "in_proxy"})
    assert default.core_settings().count_process_memory is True
    off = FilterConfig.from_conf({"execution": "in_proxy", "count_process_memory": "false"})
    assert off.core_settings().count_process_memory is False


def test_every_core_setting_but_devices_is_an_in_proxy_option() -> None:
    """A setting added to the core is an option of the filter without a second declaration;
    the options named before the core existed keep their names."""
    assert set(IN_PROXY_OPTIONS.values()) == set(CoreSettings.model_fields) - {"devices"}
    renamed = {option: f for option, f in IN_PROXY_OPTIONS.items() if option != f}
    assert renamed == {
        "memory_budget_bytes": "cpu_memory_budget_bytes",
        "max_concurrent": "max_concurrent_per_device",
        "request_timeout": "request_timeout_s",
        "retry_after": "retry_after_s",
    }
    assert not set(IN_PROXY_OPTIONS) & set(FilterConfig.model_fields)


def test_the_proxy_defaults_are_the_cores_but_those_stated_with_a_reason() -> None:
    """What an in-proxy section that sets nothing runs with: the filter's defaults as they
    always were, every other one the core's (the HAPI server's)."""
    config = FilterConfig.from_conf({"execution": "in_proxy"})
    core = config.core_settings()
    assert {o: p.value for o, p in PROXY_DEFAULTS.items()} == {
        "memory_budget_bytes": 2 * 2**30,
        "max_concurrent": 2,
        "queue_limit": 64,
        "retry_after": 5,
        "weights_cache_bytes": 2**30,
        "feature_store_bytes": 0,
    }
    assert all(p.reason for p in PROXY_DEFAULTS.values())
    for option, field in IN_PROXY_OPTIONS.items():
        expected = PROXY_DEFAULTS[option].value if option in PROXY_DEFAULTS else None
        if expected is None:
            expected = CoreSettings.model_fields[field].default
        assert getattr(core, field) == expected, option
    assert core.devices is None  # device = auto
    assert (config.max_concurrent, config.queue_limit) == (2, 64)
    assert (config.retry_after, config.request_timeout, config.send_timeout) == (5, 600, 60)


def test_core_settings_are_options_parsed_from_strings() -> None:
    config = FilterConfig.from_conf(
        {
            "execution": "in_proxy",
            "cores": "4",
            "decode_threads": "0",
            "decode_path": "pil",
            "allow_tf32": "true",
            "feature_store_dir": "",
            "gpu_memory_limit_bytes": "",
            "memory_budget_bytes": str(3 * 2**30),
            "request_timeout": "30.5",
        }
    )
    core = config.core_settings()
    assert (core.cores, core.decode_threads, core.decode_path) == (4, 0, "pil")
    assert core.allow_tf32 is True
    assert (core.feature_store_dir, core.gpu_memory_limit_bytes) == (None, None)
    assert core.cpu_memory_budget_bytes == 3 * 2**30
    assert config.request_timeout == core.request_timeout_s == 30.5


def test_in_proxy_options_in_the_proxys_defaults_are_taken() -> None:
    """[DEFAULT] holds the whole proxy's options: ours are taken (the section wins), Swift's
    own ``devices`` is not an option of the filter and is left alone."""
    config = FilterConfig.from_paste(
        {"devices": "/srv/node", "decode_threads": "1", "queue_limit": "9"},
        {"execution": "in_proxy", "queue_limit": "3"},
    )
    assert (config.core_settings().decode_threads, config.queue_limit) == (1, 3)


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({}, "hapi_servers is required"),
        ({"hapi_servers": "a:8090"}, "not an http"),
        ({"hapi_servers": "http://a:8090/v1"}, "without a path"),
        ({"hapi_servers": "http://a:80x"}, "bad port"),
        ({"hapi_servers": "http://a, http://a"}, "same server twice"),
        ({"hapi_servers": "http://a", "execution": "inside"}, "execution"),
        ({"hapi_servers": "http://a", "max_body_bytes": "ten"}, "max_body_bytes"),
        ({"hapi_servers": "http://a", "conn_timeout": "0"}, "conn_timeout"),
        ({"hapi_servers": "http://a", "device": "tpu"}, "device must be"),
        ({"hapi_servers": "http://a", "hapi_server": "http://b"}, "hapi_server: Extra inputs"),
        ({"execution": "in_proxy", "memory_budget_bytes": "1"}, "memory_budget_bytes: Input"),
        ({"execution": "in_proxy", "max_concurrent": "two"}, "max_concurrent: Input"),
        ({"execution": "in_proxy", "decode_path": "simd"}, "decode_path: Input should be"),
        ({"execution": "in_proxy", "devices": "cpu"}, "devices: Extra inputs"),
        ({"execution": "in_proxy", "b_min": "0", "conn_timeout": "0"}, "conn_timeout.*b_min"),
    ],
)
def test_bad_options_fail_at_start_with_the_option_named(
    conf: dict[str, str], message: str
) -> None:
    with pytest.raises(FilterConfigError, match=message) as failed:
        FilterConfig.from_conf(conf)
    assert str(failed.value).startswith("[filter:hapi]")


# --- The option tables of swift_middleware.middleware's docstring, generated from the declaration.

TABLE_START, TABLE_END = ".. options-table:start", ".. options-table:end"
_WIDTHS = (26, 11, 59)


def _default(name: str, value: object) -> str:
    if value is None or value == []:
        return "(none)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, float):
        return f"{value:g}"
    if name.endswith("_bytes") and isinstance(value, int):
        for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
            if value >= size and value % size == 0:
                return f"{value // size} {unit}"
    return str(value)


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    rule = "  ".join("=" * w for w in _WIDTHS)
    lines = [
        rule,
        "  ".join(
            h.ljust(w) for h, w in zip(("Option", "Default", "Meaning"), _WIDTHS, strict=True)
        ).rstrip(),
        rule,
    ]
    for option, default, meaning in rows:
        wrapped = textwrap.wrap(meaning, _WIDTHS[2]) or [""]
        lines.append(f"{option.ljust(_WIDTHS[0])}  {default.ljust(_WIDTHS[1])}  {wrapped[0]}")
        lines += [" " * (_WIDTHS[0] + _WIDTHS[1] + 4) + more for more in wrapped[1:]]
    return [*lines, rule]


def options_table() -> str:
    """The docstring's option tables: the filter's own options, then the in-proxy options with
    the core's descriptions and the proxy's defaults, and why those differ."""
    own = []
    for name, field in FilterConfig.model_fields.items():
        assert field.description, f"FilterConfig.{name} has no description"
        value = field.get_default(call_default_factory=True, validated_data={})
        own.append((name, _default(name, value), field.description))
    in_proxy = []
    for option, core_field in IN_PROXY_OPTIONS.items():
        field = CoreSettings.model_fields[core_field]
        assert field.description, f"CoreSettings.{core_field} has no description"
        proxy = PROXY_DEFAULTS.get(option)
        default = _default(option, field.default if proxy is None else proxy.value)
        meaning = field.description
        if option != core_field:
            meaning += f" (the core's ``{core_field}``)"
        in_proxy.append((option, default + (" *" if proxy else ""), meaning))
    notes = []
    for option, proxy in PROXY_DEFAULTS.items():
        server = CoreSettings.model_fields[IN_PROXY_OPTIONS[option]].default
        notes += textwrap.wrap(
            f"- ``{option}`` {_default(option, proxy.value)} (server: "
            f"{_default(option, server)}): {proxy.reason}.",
            99,
            subsequent_indent="  ",
        )
    lines = [
        "The filter's own options:",
        "",
        *_table(own),
        "",
        "The in-proxy options: the extraction core's settings (:class:`hapi_core.CoreSettings`),",
        "with its checks and meanings, under these names:",
        "",
        *_table(in_proxy),
        "",
        "Defaults marked * differ from the HAPI server's:",
        "",
        *notes,
    ]
    return "\n".join(lines)


def test_middleware_docstring_tables_are_generated_from_the_declaration() -> None:
    doc = middleware.__doc__ or ""
    start, end = doc.index(TABLE_START) + len(TABLE_START), doc.index(TABLE_END)
    assert doc[start:end].strip() == options_table(), (
        "swift_middleware/middleware.py's option tables are stale; replace them with:\n"
        + options_table()
    )
