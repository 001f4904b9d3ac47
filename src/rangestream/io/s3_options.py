"""What S3 storage options mean for reads: the lean client's configuration, and credentials.

``lean_read_config`` accepts only storage options whose meaning the lean client reproduces
exactly; anything else (``requester_pays``, SSE-C in ``s3_additional_kwargs``, ``profile``,
a botocore ``session``, unknown ``config_kwargs``...) returns ``None`` and keeps reads on
s3fs, so choosing the lean path never changes what a read does.

- Credentials: ``key``/``secret``/``token`` (or ``username``/``password``, or
  ``client_kwargs.aws_access_key_id``/``aws_secret_access_key``/``aws_session_token``), else
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, else botocore's
  credential chain (profiles, SSO, instance roles...), resolved once per process and only
  when needed; refreshable credentials are frozen per request. ``anon=True``: unsigned.
- What the options leave out is resolved by botocore's own session, as for s3fs's writes
  (``botocore_configuration``): the endpoint (``endpoint_url`` or
  ``client_kwargs.endpoint_url``, else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, else
  the profile's ``services`` section or ``endpoint_url``, else
  ``https://s3.<region>.amazonaws.com``); the region (``client_kwargs.region_name`` /
  ``config_kwargs.region_name``, else ``AWS_DEFAULT_REGION`` or the profile's ``region``,
  else ``us-east-1``); the certificates to trust (``AWS_CA_BUNDLE`` or the profile's
  ``ca_bundle``); the addressing style.
- Addressing: path-style on custom endpoints; virtual-hosted on AWS for DNS-compatible bucket
  names (``config_kwargs={"s3": {"addressing_style": "path" | "virtual"}}``, or the
  profile's ``s3.addressing_style``, forces either). Proxies: ``HTTP(S)_PROXY`` /
  ``NO_PROXY`` from the environment, as botocore. A ``profile`` or ``verify`` option keeps
  reads on s3fs.

Opt out (reads through s3fs): ``RANGESTREAM_S3_READS=s3fs`` in the environment (read when a
store is made, and inherited by DataLoader workers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rangestream.io.process import ProcessLocal
from rangestream.io.request_cap import process_max_requests

__all__ = [
    "DEFAULT_REGION",
    "READS_ENV",
    "S3ReadConfig",
    "aws_environment_key",
    "botocore_configuration",
    "chain_credentials",
    "lean_read_config",
    "lean_reads_enabled",
    "static_credentials",
]

READS_ENV = "RANGESTREAM_S3_READS"
DEFAULT_REGION = "us-east-1"
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 30.0

#: Top-level s3fs options that do not change what a read sends or returns.
_NEUTRAL_OPTIONS = frozenset(
    {
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "cache_regions",
        "fixed_upload_size",
        "max_concurrency",
        "asynchronous",
        "use_ssl",  # True is the default; False is refused below
    }
)
_CREDENTIAL_OPTIONS = frozenset({"key", "secret", "token", "username", "password", "anon"})
_CLIENT_KWARGS = frozenset(
    {
        "endpoint_url",
        "region_name",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
    }
)
#: ``retries`` is accepted and ignored: RangeReader owns retries (the store turns botocore's off).
#: The checksum settings change nothing here: the lean client neither adds request checksums
#: to its GETs nor validates the transport's (the dataset's crc32c checks every chunk).
_CONFIG_KWARGS = frozenset(
    {
        "connect_timeout",
        "read_timeout",
        "max_pool_connections",
        "retries",
        "region_name",
        "s3",
        "request_checksum_calculation",
        "response_checksum_validation",
    }
)


def lean_reads_enabled() -> bool:
    """Whether the environment leaves S3 reads to ``S3ReadClient`` (the default)."""
    return os.environ.get(READS_ENV, "").strip().lower() != "s3fs"


@dataclass(frozen=True)
class S3ReadConfig:
    """What ``S3ReadClient`` needs from ``storage_options``; made by ``lean_read_config``.

    ``key``/``secret`` left ``None`` (and ``anon`` false) means the environment or botocore's
    credential chain supplies credentials when the first request is signed.
    """

    endpoint_url: str | None
    region: str
    anon: bool = False
    key: str | None = None
    secret: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    addressing_style: str = "auto"
    #: certificates to trust (``AWS_CA_BUNDLE`` / the profile's ``ca_bundle``), else the system's
    ca_bundle: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    #: connections of the pool: the process request cap unless ``max_pool_connections``
    #: says otherwise (``io.request_cap``: a smaller pool is a second, hidden cap)
    max_connections: int = field(default_factory=process_max_requests)


def lean_read_config(storage_options: dict[str, Any]) -> S3ReadConfig | None:
    """The lean client's configuration, or ``None`` if s3fs must keep serving the reads.

    ``None`` whenever an option is present whose effect on reads this client does not
    reproduce, so choosing the lean path never changes what a read does.
    """
    options = dict(storage_options)
    for name in list(options):
        if name in _NEUTRAL_OPTIONS:
            value = options.pop(name)
            if name == "use_ssl" and value is not True:
                return None
    client_kwargs = dict(options.pop("client_kwargs", None) or {})
    config_kwargs = dict(options.pop("config_kwargs", None) or {})
    top_endpoint = options.pop("endpoint_url", None)
    credentials = {name: options.pop(name) for name in list(options) if name in _CREDENTIAL_OPTIONS}
    # requester_pays, version_aware and s3_additional_kwargs change nothing when off or empty
    for name in ("requester_pays", "version_aware", "s3_additional_kwargs"):
        if options.pop(name, None):
            return None
    if options:  # profile, session, loop, anything unknown
        return None
    if not set(client_kwargs) <= _CLIENT_KWARGS or not set(config_kwargs) <= _CONFIG_KWARGS:
        return None
    s3_config = dict(config_kwargs.get("s3") or {})
    addressing_style = s3_config.pop("addressing_style", "auto") or "auto"
    if s3_config or addressing_style not in {"auto", "path", "virtual"}:
        return None

    client_endpoint = client_kwargs.get("endpoint_url")
    if top_endpoint and client_endpoint and top_endpoint != client_endpoint:
        return None  # s3fs would refuse or pick one; let it
    configured = botocore_configuration()
    if configured is None:
        return None  # a shared configuration this client does not reproduce
    endpoint_url = top_endpoint or client_endpoint or configured.endpoint_url or None
    if endpoint_url is not None and not str(endpoint_url).startswith(("http://", "https://")):
        return None
    region = (
        client_kwargs.get("region_name")
        or config_kwargs.get("region_name")
        or configured.region
        or DEFAULT_REGION
    )
    if "addressing_style" not in (config_kwargs.get("s3") or {}):
        addressing_style = configured.addressing_style or addressing_style

    key = credentials.get("key") or credentials.get("username")
    secret = credentials.get("secret") or credentials.get("password")
    token = credentials.get("token")
    if credentials.get("key") and credentials.get("username"):
        return None
    if credentials.get("secret") and credentials.get("password"):
        return None
    key = key or client_kwargs.get("aws_access_key_id")
    secret = secret or client_kwargs.get("aws_secret_access_key")
    token = token or client_kwargs.get("aws_session_token")
    anon = bool(credentials.get("anon", False))
    if not anon and bool(key) != bool(secret):
        return None  # half a key pair: botocore's rules for that are its own
    if anon:
        key = secret = token = None

    retries = config_kwargs.get("retries")
    if retries is not None and not isinstance(retries, dict):
        return None
    try:
        return S3ReadConfig(
            endpoint_url=str(endpoint_url).rstrip("/") if endpoint_url else None,
            region=str(region),
            anon=anon,
            key=key,
            secret=secret,
            token=token,
            addressing_style=addressing_style,
            ca_bundle=configured.ca_bundle,
            connect_timeout=float(config_kwargs.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)),
            read_timeout=float(config_kwargs.get("read_timeout", DEFAULT_READ_TIMEOUT)),
            max_connections=int(
                config_kwargs.get("max_pool_connections") or process_max_requests()
            ),
        )
    except (TypeError, ValueError):
        return None


# -- botocore's shared configuration -------------------------------------------------------


@dataclass(frozen=True)
class BotocoreConfiguration:
    """What botocore (so s3fs's writes) takes from the environment and the shared config
    files of the current profile, for an S3 client made without those options."""

    region: str | None
    endpoint_url: str | None
    ca_bundle: str | None
    addressing_style: str | None


#: Settings of a profile's ``s3`` section that change where or how requests go, which the
#: lean client does not reproduce (reads then stay on s3fs).
_UNREPRODUCED_S3_SETTINGS = frozenset(
    {"use_accelerate_endpoint", "use_dualstack_endpoint", "use_arn_region",
     "us_east_1_regional_endpoint", "s3_disable_multiregion_access_points"}
)  # fmt: skip
#: environment -> its resolved configuration. A plain dict, not ``ProcessLocal``: the values
#: are plain data, so forked DataLoader workers keep the parent's (resolving it again cost
#: each worker a botocore session, 10-90 ms of its start); a changed environment is a new key.
_configurations: dict[tuple[tuple[str, str], ...], BotocoreConfiguration | None] = {}


def botocore_configuration() -> BotocoreConfiguration | None:
    """Region, endpoint, CA bundle and addressing style as botocore resolves them.

    From botocore's own session (so from the same sources, in the same order: ``AWS_*``
    variables, then the profile of ``AWS_PROFILE`` or ``default`` in ``AWS_CONFIG_FILE``,
    its ``services`` section included), so reads and writes of one storage go to the same
    endpoint, signed for the same region, trusting the same certificates. ``None`` when the
    profile asks for something this client does not do (an accelerate or dual-stack
    endpoint...). Resolved once per process and environment.
    """
    environment = _aws_environment()
    if environment not in _configurations:
        _configurations[environment] = _resolve_botocore_configuration()
    return _configurations[environment]


def _aws_environment() -> tuple[tuple[str, str], ...]:
    """The ``AWS_*`` variables, and which version of the shared config file botocore reads."""
    variables = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
    path = os.path.expanduser(os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config")
    try:
        stat = os.stat(path)
        version = f"{path}:{stat.st_mtime_ns}:{stat.st_size}"
    except OSError:
        version = f"{path}:absent"
    return (*variables, ("config file", version))


def aws_environment_key() -> str:
    """The ``AWS_*`` environment as a string, for keys of clients shared in a process."""
    return repr(_aws_environment())


def _resolve_botocore_configuration() -> BotocoreConfiguration | None:
    import copy

    import botocore.session

    session = botocore.session.Session()
    # as Session.create_client does: a copy of the store with the endpoint provider of s3
    store = copy.copy(session.get_component("config_store"))
    session._add_configured_endpoint_provider(client_name="s3", config_store=store)
    endpoint = None
    if not store.get_config_variable("ignore_configured_endpoint_urls"):
        endpoint = store.get_config_variable("endpoint_url")
    s3 = dict(store.get_config_variable("s3") or {})
    if any(_truthy(s3.get(name)) for name in _UNREPRODUCED_S3_SETTINGS):
        return None
    if store.get_config_variable("use_dualstack_endpoint") or store.get_config_variable(
        "use_fips_endpoint"
    ):
        return None
    style = s3.get("addressing_style")
    if style not in (None, "auto", "path", "virtual"):
        return None
    return BotocoreConfiguration(
        region=session.get_config_variable("region") or None,
        endpoint_url=str(endpoint) if endpoint else None,
        ca_bundle=session.get_config_variable("ca_bundle") or None,
        addressing_style=style,
    )


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in {"true", "1", "yes"} if value is not None else False


# -- credentials -------------------------------------------------------------------------

_chain = ProcessLocal[tuple[Any]]()  # (botocore credentials or None,)


def chain_credentials() -> Any:
    """botocore's credential chain, resolved once per process (a few ms, plus any I/O)."""

    def resolve() -> tuple[Any]:
        import botocore.session

        return (botocore.session.get_session().get_credentials(),)

    return (_chain.value or _chain.get_or_make(resolve))[0]


@dataclass(frozen=True)
class _Keys:
    """What botocore's signer reads from credentials (importing ``botocore.credentials``
    is slow, and static keys need none of it)."""

    access_key: str
    secret_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)


def static_credentials(config: S3ReadConfig) -> _Keys | None:
    """Credentials from the options or the environment; ``None`` means ask the chain."""
    if config.key and config.secret:
        return _Keys(config.key, config.secret, config.token)
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return _Keys(key, secret, os.environ.get("AWS_SESSION_TOKEN") or None)
    return None
