"""Kiln settings: read once from the environment, validated at start-up."""
from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from devices.environment import env_number
from kiln.core.client_address import InvalidProxyList, parse_trusted_proxies
from kiln.storage_settings import blob_storage_settings
from workers import host_memory
from workers import routing as _routing
from workers.sandbox import policy as sandbox_policy

BASE_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = BASE_DIR.parent


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {raw!r}")


def _env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    return _configured(env_number, name, default, whole=True, low=minimum)


def _env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    return _configured(env_number, name, default, low=minimum)


def _configured(read, *args, **kwargs):
    """A value read by Kiln's own readers, whose bad values raise ValueError, stopping start-up with ImproperlyConfigured."""
    try:
        return read(*args, **kwargs)
    except ValueError as error:
        raise ImproperlyConfigured(str(error)) from None


DEBUG = _env_bool("KILN_DEBUG", False)
# An empty KILN_DATA_DIR (a shell that exported it blank) is unset, never the current folder.
DATA_DIR = Path(os.environ.get("KILN_DATA_DIR") or REPO_ROOT / "var").resolve()

SECRET_KEY = os.environ.get("KILN_SECRET_KEY", "")
if not SECRET_KEY:
    if not _env_bool("KILN_ALLOW_INSECURE_DEFAULTS", True):
        raise ImproperlyConfigured("Set KILN_SECRET_KEY to a long random string.")
    # The embedded default keeps a per-install key on disk so tokens survive restarts.
    _key_file = DATA_DIR / "secret_key"
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    if not _key_file.exists():
        import secrets

        fd = os.open(_key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
    SECRET_KEY = _key_file.read_text().strip()
if len(SECRET_KEY) < 32:
    raise ImproperlyConfigured("KILN_SECRET_KEY must be at least 32 characters.")

# Token digests use their own key so that rotating SECRET_KEY (sessions) keeps API tokens valid.
TOKEN_HMAC_KEY = os.environ.get("KILN_TOKEN_HMAC_KEY", SECRET_KEY)

ALLOWED_HOSTS = [h.strip() for h in os.environ.get("KILN_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("KILN_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "kiln.core",
    "kiln.accounts",
    "kiln.registry",
    "kiln.pipeline",
    "kiln.fleet",
    "kiln.reports",
]

MIDDLEWARE = [
    "kiln.core.middleware.ClientAddressMiddleware",
    "kiln.core.middleware.RequestMetricsMiddleware",
    "kiln.core.middleware.UploadLimitMiddleware",
    "kiln.core.middleware.ContentSecurityPolicyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "kiln.core.middleware.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "kiln.urls"
WSGI_APPLICATION = "kiln.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASE_URL = os.environ.get("DATABASE_URL", "")
# PostgreSQL connections one process may hold at once (0: no pool). Under ASGI every sync request
# runs in a thread of its own, so without a bound a burst of agents opens one connection each and
# max_connections (100 by default) runs out for everyone; `make up` and docker-compose give the web
# server a pool. Connections are not kept across requests: ASGI's per-request threads would leak them.
DB_POOL_SIZE = _env_int("KILN_DB_POOL_SIZE", 0, minimum=0)
if DATABASE_URL:
    _database = dj_database_url.parse(DATABASE_URL, conn_max_age=0)
    if DB_POOL_SIZE and _database["ENGINE"] == "django.db.backends.postgresql":
        # A request waits up to `timeout` for a free connection rather than failing at once. The check
        # on checkout replaces a connection that a database restart killed while it sat idle in the
        # pool, instead of handing it to a request (a 500 per stale connection); it spends a round
        # trip only when the server has spoken or hung up (kiln.core.postgresql).
        _database.setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": DB_POOL_SIZE, "timeout": 30}
        _database["ENGINE"] = "kiln.core.postgresql"
    DATABASES = {"default": _database}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "kiln.sqlite3"),
            # Worker, web and tests share one file; wait for the write lock instead of failing. WAL:
            # readers and the one writer do not block each other (in the default rollback journal
            # every read waits out a commit and a commit waits out every read: a fleet of agents
            # heartbeating and polling queued behind one another for seconds). synchronous=NORMAL is
            # the setting WAL is meant for: a commit survives a crash of the process, and a power
            # cut loses at most the last commits, never the file's consistency.
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE",
                        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"},
            "TEST": {"NAME": str(DATA_DIR / "test-kiln.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 8}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
FRONTEND_DIST = REPO_ROOT / "frontend" / "dist"
# The built UI is served at / by WhiteNoise (assets) and a catch-all view (index.html).
WHITENOISE_ROOT = FRONTEND_DIST if FRONTEND_DIST.exists() else None
WHITENOISE_USE_FINDERS = True
# The documentation site `make docs` builds from docs/ (MkDocs), served at /docs/ by kiln.core.docs_site.
DOCS_SITE = REPO_ROOT / "site"

# Blob storage: content-addressed; a folder under KILN_DATA_DIR/blobs unless S3 is configured (below).
BLOB_ROOT = Path(os.environ.get("KILN_BLOB_ROOT", DATA_DIR / "blobs")).resolve()
UPLOAD_TMP_DIR = DATA_DIR / "tmp"
# S3-compatible storage (AWS S3, MinIO) instead of the folder when KILN_S3_BUCKET is set; agents and
# browsers then move blobs through short-lived presigned URLs (one object, one method each).
_BLOB_STORAGE_SETTINGS = blob_storage_settings(os.environ)
S3_BUCKET = _BLOB_STORAGE_SETTINGS["S3_BUCKET"]
S3_ENDPOINT_URL = _BLOB_STORAGE_SETTINGS["S3_ENDPOINT_URL"]
# The address agents and browsers reach the storage at, when it differs from the server's (compose: minio:9000 vs localhost:9000).
S3_PUBLIC_ENDPOINT_URL = _BLOB_STORAGE_SETTINGS["S3_PUBLIC_ENDPOINT_URL"]
S3_PRESIGN_SECONDS = _BLOB_STORAGE_SETTINGS["S3_PRESIGN_SECONDS"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "blobs": _BLOB_STORAGE_SETTINGS["BLOB_STORAGE"],
}
MAX_UPLOAD_BYTES = _env_int("KILN_MAX_UPLOAD_BYTES", 4 * 1024**3)
MAX_ARCHIVE_UNCOMPRESSED_BYTES = _env_int("KILN_MAX_ARCHIVE_BYTES", 8 * 1024**3)
MAX_ARCHIVE_RATIO = _env_int("KILN_MAX_ARCHIVE_RATIO", 100)
# JSON bodies are read into memory, so they get their own, much smaller limits.
MAX_JSON_BYTES = _env_int("KILN_MAX_JSON_BYTES", 1024**2, minimum=1024)
MAX_AGENT_RESULT_BYTES = _env_int("KILN_MAX_AGENT_RESULT_BYTES", 4 * 1024**2, minimum=64 * 1024)
# What one organization may keep stored (its blobs, plus uploads in flight at their declared length);
# 0: no quota. Checked when an upload starts and when a job is created.
STORAGE_QUOTA_BYTES = _env_int("KILN_STORAGE_QUOTA_BYTES", 100 * 1024**3, minimum=0)
# Declared array bytes of one dataset (checked from the .npy headers before any data is read).
MAX_DATASET_BYTES = _env_int("KILN_MAX_DATASET_BYTES", 8 * 1024**3, minimum=1)
# Elements of one model input at batch 1; stages allocate inputs this size, so it is refused at upload.
MAX_INPUT_ELEMENTS = _env_int("KILN_MAX_INPUT_ELEMENTS", 2**28, minimum=1)
# PyTorch uploads are loaded and exported in a sandboxed child process with these limits.
TORCH_SANDBOX_MEMORY_MB = _env_int("KILN_TORCH_SANDBOX_MEMORY_MB", 6144, minimum=1024)
TORCH_SANDBOX_CPU_SECONDS = _env_int("KILN_TORCH_SANDBOX_CPU_SECONDS", 600, minimum=10)
# Where the kernel grants none of the OS confinements (workers/sandbox/confine.py), users' files are refused;
# KILN_SANDBOX_ALLOW_UNCONFINED=true runs them with rlimits and the in-process guard only, in tests and
# development (KILN_DEBUG=true) only. KILN_SANDBOX_UID is the identity a sandbox started by root takes.
# workers.sandbox.policy owns both (the sandbox runner reads them there too); a server start refuses an unsafe one.
try:
    SANDBOX_ALLOW_UNCONFINED = sandbox_policy.allow_unconfined()
    SANDBOX_UID = sandbox_policy.sandbox_uid()
except sandbox_policy.UnsafeSandboxSetting as exc:
    raise ImproperlyConfigured(str(exc)) from None
UPLOAD_TMP_DIR.mkdir(parents=True, exist_ok=True)
FILE_UPLOAD_TEMP_DIR = str(UPLOAD_TMP_DIR)
# Every upload streams to a temp file, hashed on the way and cut off at the limit; set globally
# because a session's CSRF check parses the body before any view could choose handlers.
FILE_UPLOAD_HANDLERS = ["kiln.registry.uploads.HashingUploadHandler"]
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024

ALLOW_SIGNUP = _env_bool("KILN_ALLOW_SIGNUP", True)
# Reverse proxies (addresses or networks) whose X-Forwarded-For and X-Forwarded-Proto are believed;
# empty: none, the socket's peer is the client (kiln.core.client_address owns this decision).
try:
    TRUSTED_PROXIES = parse_trusted_proxies(os.environ.get("KILN_TRUSTED_PROXIES", ""))
except InvalidProxyList as exc:
    raise ImproperlyConfigured(f"KILN_TRUSTED_PROXIES: {exc}.") from None
if os.environ.get("KILN_NUM_PROXIES", "0").strip() not in ("", "0"):
    # A count of proxies cannot tell the proxy's entry from one the client wrote: names can.
    raise ImproperlyConfigured("KILN_NUM_PROXIES is replaced by KILN_TRUSTED_PROXIES: list your reverse proxies' addresses or "
                               "networks (e.g. KILN_TRUSTED_PROXIES=10.0.0.5) and unset KILN_NUM_PROXIES.")
if TRUSTED_PROXIES:
    # Believed only from a trusted proxy: ClientAddressMiddleware drops the header from anyone else.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Deployment packages are signed with this Ed25519 key (PEM, PKCS#8); generated there on first use.
PACKAGE_SIGNING_KEY_FILE = Path(os.environ.get("KILN_PACKAGE_SIGNING_KEY", DATA_DIR / "package-signing-key.pem")).resolve()

# Celery: Redis when REDIS_URL is set, otherwise an embedded filesystem transport.
REDIS_URL = os.environ.get("REDIS_URL", "")
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL or "filesystem://")
CELERY_QUEUE_DIR = DATA_DIR / "queue"
CELERY_TASK_ALWAYS_EAGER = _env_bool("KILN_CELERY_EAGER", False)

# One cache shared by every process (throttle counters must not be per process): Redis when
# configured, otherwise files under the data folder, which the embedded default's processes share.
if REDIS_URL:
    # One connection pool per process, not per request (kiln.core.cache).
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL, "KEY_PREFIX": "kiln",
                          "OPTIONS": {"pool_class": "kiln.core.cache.SharedConnectionPool"}}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache", "LOCATION": str(DATA_DIR / "cache")}}

# Prometheus metrics at /metrics (off by default). Several server processes each write their
# samples under METRICS_DIR and a scrape sums them (prometheus_client's multiprocess mode).
METRICS = _env_bool("KILN_METRICS", False)
METRICS_TOKEN = os.environ.get("KILN_METRICS_TOKEN", "")
METRICS_DIR = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or DATA_DIR / "metrics").resolve()
if METRICS:
    METRICS_DIR.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(METRICS_DIR)
# Logs as one JSON object per line (with job and task ids) instead of plain text.
LOG_JSON = _env_bool("KILN_LOG_JSON", False)

# Fleet timing, chosen by the server and obeyed by agents.
AGENT_HEARTBEAT_SECONDS = _env_int("KILN_AGENT_HEARTBEAT_SECONDS", 10)
AGENT_POLL_SECONDS = _env_int("KILN_AGENT_POLL_SECONDS", 5)
AGENT_LONG_POLL_SECONDS = _env_int("KILN_AGENT_LONG_POLL_SECONDS", 20)
AGENT_LEASE_SECONDS = _env_int("KILN_AGENT_LEASE_SECONDS", 120)
# A running agent's heartbeats keep its task's lease through a long stage (a TensorRT build), up to this long after its
# last progress report: a stage silent for longer is taken as hung, and the task goes back to the queue.
AGENT_SILENT_STAGE_SECONDS = _env_int("KILN_AGENT_SILENT_STAGE_SECONDS", 3600, minimum=1)
AGENT_OFFLINE_AFTER_SECONDS = _env_int("KILN_AGENT_OFFLINE_AFTER_SECONDS", 60)
# The long-poll and heartbeat intervals above are floors: with a larger fleet online the server
# stretches both so that the fleet sends about this many of them a second (kiln.fleet.intervals).
AGENT_POLLS_PER_SECOND = _env_int("KILN_AGENT_POLLS_PER_SECOND", 100, minimum=1)
# How long a server process trusts an agent token it has checked (0: check every request). A
# revocation reaches the other processes within this; the revoking process forgets at once. Longer
# than the heartbeat interval on purpose: an agent calls each process every 10-20 s, so a shorter
# entry would expire before it is used again (measured: 5 s saved almost no lookups at 1,000 agents).
AGENT_AUTH_CACHE_SECONDS = _env_int("KILN_AGENT_AUTH_CACHE_SECONDS", 30, minimum=0)
# The same for users' API tokens (kiln_pat_…), with the user's membership in the token's
# organization: a revocation, a role change or a removal through the API takes effect at once in
# the process that made it and within this many seconds in the others (0: check every request).
API_TOKEN_AUTH_CACHE_SECONDS = _env_int("KILN_API_TOKEN_AUTH_CACHE_SECONDS", 30, minimum=0)
# Registrations one server process runs at once; the rest wait on the event loop, holding no thread
# and no database connection. A fleet coming up is a burst of registrations (each an INSERT in its
# own thread): unbounded, they took every pooled connection and the heartbeats, lease checks and
# user requests behind them waited 10-20 s for one.
AGENT_REGISTER_CONCURRENCY = _env_int("KILN_AGENT_REGISTER_CONCURRENCY", 4, minimum=1)
# Each server process re-checks for its longest-waiting agent this often, in case a wake-up was lost
# (kiln.core.notify): the most a lost wake-up costs, in seconds.
WAKE_PROBE_SECONDS = _env_int("KILN_WAKE_PROBE_SECONDS", 3, minimum=1)
# Heartbeats are noted in memory and written in one UPDATE per this many seconds (kiln.fleet.heartbeats).
AGENT_HEARTBEAT_FLUSH_SECONDS = _env_int("KILN_AGENT_HEARTBEAT_FLUSH_SECONDS", 1, minimum=1)
DEVICE_TASK_MAX_ATTEMPTS = _env_int("KILN_DEVICE_TASK_MAX_ATTEMPTS", 3)
# Celery beat: lease expiry, re-dispatch of waiting jobs, offline agents, the stuck-work reaper.
HOUSEKEEPING_SECONDS = _env_int("KILN_HOUSEKEEPING_SECONDS", 5)
# Work leases of host-side tasks: a running stage or variant build renews its lease every third of
# WORK_LEASE_SECONDS; one that expires (the worker died) is sent again, at most WORK_MAX_ATTEMPTS
# times. A task still queued after WORK_QUEUE_GRACE_SECONDS (its message was lost) is sent again.
WORK_LEASE_SECONDS = _env_int("KILN_WORK_LEASE_SECONDS", 60, minimum=3)
WORK_QUEUE_GRACE_SECONDS = _env_int("KILN_WORK_QUEUE_GRACE_SECONDS", 900, minimum=1)
WORK_MAX_ATTEMPTS = _env_int("KILN_WORK_MAX_ATTEMPTS", 3, minimum=1)
BENCHMARK_MIN_RUNS = _env_int("KILN_BENCHMARK_MIN_RUNS", 50)
BENCHMARK_MIN_SECONDS = _env_float("KILN_BENCHMARK_MIN_SECONDS", 3.0, minimum=0.0)
BENCHMARK_WARMUP_RUNS = _env_int("KILN_BENCHMARK_WARMUP_RUNS", 10)
BENCHMARK_WARMUP_SECONDS = _env_float("KILN_BENCHMARK_WARMUP_SECONDS", 1.0, minimum=0.0)
# The most rounds an agent times a device's finalists side by side; it stops earlier once the fastest separates at 95%.
RETIME_MAX_ROUNDS = _env_int("KILN_RETIME_MAX_ROUNDS", 30, minimum=6)
if RETIME_MAX_ROUNDS > 64:
    raise ImproperlyConfigured("KILN_RETIME_MAX_ROUNDS must be at most 64 (an agent reports at most 64 rounds).")
# While another job's task waits for the same device, a re-timing's rounds stop after this many seconds (past their
# minimum): the device serves jobs in turn, and a gap of a few percent may not separate however many rounds it gets.
RETIME_SHARED_SECONDS = _env_int("KILN_RETIME_SHARED_SECONDS", 30, minimum=1)
# A decision whose deciding rounds were busy is provisional: the finalists are re-timed this many times more, each time after
# the agent waited up to RETIME_QUIET_WAIT_S for its device to be quiet (kiln.pipeline.retime `retime_when_quiet`).
RETIME_QUIET_ATTEMPTS = _env_int("KILN_RETIME_QUIET_ATTEMPTS", 2, minimum=0)
if RETIME_QUIET_ATTEMPTS > 5:
    raise ImproperlyConfigured("KILN_RETIME_QUIET_ATTEMPTS must be at most 5 (each attempt re-times every finalist).")
RETIME_QUIET_WAIT_S = _env_int("KILN_RETIME_QUIET_WAIT_S", 300, minimum=1)
# Read in each build (workers/host_memory.py owns it); read here too so that a bad value stops start-up.
BUILD_MEMORY_MB = _configured(host_memory.build_memory_mb)

# Work classes (workers/routing.py): control steps, builds and sandboxed checks each have a queue and a worker of their
# own. What bounded work may book of this host's memory (workers/host_memory.py; 0: 80% of physical memory).
HOST_MEMORY_MB = _configured(host_memory.host_memory_mb)
# Builds a host runs at once (the build worker's concurrency; 0: one per core, as many as the host's memory holds at
# KILN_BUILD_MEMORY_MB each), and sandboxed checks (0: two where cores and memory allow).
BUILD_SLOTS = _env_int("KILN_BUILD_SLOTS", 0, minimum=0) or _routing.build_slots(
    cores=_routing.usable_cores(), host_memory_mb=HOST_MEMORY_MB, build_memory_mb=BUILD_MEMORY_MB)
CHECK_SLOTS = _env_int("KILN_CHECK_SLOTS", 0, minimum=0) or _routing.check_slots(
    cores=_routing.usable_cores(), host_memory_mb=HOST_MEMORY_MB, check_memory_mb=TORCH_SANDBOX_MEMORY_MB)
# Per organization: builds at once while another organization's builds wait (0: half the build slots, at least one),
# and sandboxed checks at once, upload checks and exports included (a request over the limit gets 429).
BUILDS_PER_ORGANIZATION = _env_int("KILN_BUILDS_PER_ORGANIZATION", 0, minimum=0) or max(1, BUILD_SLOTS // 2)
CHECKS_PER_ORGANIZATION = _env_int("KILN_CHECKS_PER_ORGANIZATION", 2, minimum=1)
# Sandboxes one host runs at once, of every organization (0: as many as the host's memory holds at
# KILN_TORCH_SANDBOX_MEMORY_MB each, at least one).
SANDBOXES_PER_HOST = _env_int("KILN_SANDBOXES_PER_HOST", 0, minimum=0) or max(1, HOST_MEMORY_MB // TORCH_SANDBOX_MEMORY_MB)
# How long a task refused by a per-organization limit waits before it goes back on its queue.
ADMISSION_RETRY_SECONDS = _env_int("KILN_ADMISSION_RETRY_SECONDS", 5, minimum=1)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "kiln.accounts.authentication.ApiTokenAuthentication",
        "kiln.accounts.authentication.CsrfSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["kiln.accounts.permissions.IsOrganizationMember"],
    "DEFAULT_PAGINATION_CLASS": "kiln.core.pagination.Pagination",
    "DEFAULT_PARSER_CLASSES": [
        "kiln.core.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    # REMOTE_ADDR already is the client (ClientAddressMiddleware): DRF must not read X-Forwarded-For again.
    "NUM_PROXIES": 0,
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "kiln.core.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer", "rest_framework.renderers.BrowsableAPIRenderer"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Sign-in, sign-up and agent registration are where passwords and tokens get guessed.
    "DEFAULT_THROTTLE_RATES": {"credentials": os.environ.get("KILN_CREDENTIALS_RATE", "30/min")},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Kiln API",
    "DESCRIPTION": "Upload a model once; Kiln quantizes, compiles and measures it on your devices.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Self-hosted: the docs page must not fetch Swagger UI from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # One name per choice set, stable across releases: the UI's types are generated from this schema (frontend/src/api/schema.ts).
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "kiln.pipeline.models.JobStatus",
        "RoleEnum": "kiln.accounts.models.Role",
        "DatasetKindEnum": "kiln.registry.models.DatasetKind",
        "MeasurementSetEnum": "kiln.reports.selectors.MEASUREMENT_SETS",
        "OutputKindEnum": "kiln_contract.contract.OUTPUT_KINDS",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "kiln.core.logs.JsonFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", **({"formatter": "json"} if LOG_JSON else {})}},
    "root": {"handlers": ["console"], "level": os.environ.get("KILN_LOG_LEVEL", "INFO")},
    "loggers": {"django.server": {"level": "WARNING"}},
}

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
CSRF_FAILURE_VIEW = "kiln.core.views.csrf_failure"
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
PUBLIC_URL = os.environ.get("KILN_PUBLIC_URL", "").rstrip("/")
# The contract's, the agent's and the client's wheels served at /downloads/ (`make wheels`, or the Docker image, puts them there).
DOWNLOADS_DIR = Path(os.environ.get("KILN_DOWNLOADS_DIR", REPO_ROOT / "dist")).resolve()
# Where devices install the agent from (the wheels this server serves); empty: <PUBLIC_URL or the request's host>/downloads/.
DOWNLOADS_URL = os.environ.get("KILN_DOWNLOADS_URL", "").strip()
if DOWNLOADS_URL and not DOWNLOADS_URL.endswith("/"):
    DOWNLOADS_URL += "/"
# The agent's distribution name, as `pip install` takes it from the downloads above.
AGENT_DISTRIBUTION = "kiln-agent"
