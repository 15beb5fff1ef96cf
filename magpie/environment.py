"""Every environment variable magpie reads or sets of its own (MAGPIE_*), named once: users set
some of them, magpie's processes pass the others to one another. The names are part of the
interface and do not change."""

# Set by the user (or CI)
# Run code under test without a sandbox ("1"; --trust-code and [project] trust_code set it).
TRUST_CODE = "MAGPIE_TRUST_CODE"
# The store's signing seed, 64 hex digits (CI's secret), in place of the key file; taken out
# of the environment before any process starts.
SIGNING_KEY = "MAGPIE_SIGNING_KEY"
# A build's input secret, mixed into every input seed; set it to reproduce a build's inputs.
INPUT_SECRET = "MAGPIE_INPUT_SECRET"
# Seconds a build's zygote, with its parked processes, outlives the build for the next one.
KEEP_WARM_S = "MAGPIE_KEEP_WARM_S"
# Seconds a wait for a device lock may see the same holders before it gives up (600).
DEVICE_LOCK_TIMEOUT_S = "MAGPIE_DEVICE_LOCK_TIMEOUT_S"
# The folder of the records of running inference servers (else <tmp>/magpie-servers-<uid>).
SERVER_DIR = "MAGPIE_SERVER_DIR"
# The bearer token `magpie mcp --http` requires (else one is made at start); taken out of the
# environment before any process starts.
MCP_TOKEN = "MAGPIE_MCP_TOKEN"

# "0" where CUDA IPC is not available (processes in different containers): a GPU worker's
# inputs and outputs travel as files.
CUDA_IPC = "MAGPIE_CUDA_IPC"

# Set by magpie for its own processes
# The build's zygote folder, where its zygotes listen (set while a build runs).
ZYGOTE_DIR = "MAGPIE_ZYGOTE_DIR"
# The pid of the build that owns the zygote folder (absent: a kept-warm folder, owned by none).
ZYGOTE_OWNER = "MAGPIE_ZYGOTE_OWNER"
# The build's job count (-j), by which a worker's default memory limit shares the machine's memory.
JOBS = "MAGPIE_JOBS"
# For code under test: the id of the implementation it is, and the path of its source.
IMPL_ID = "MAGPIE_IMPL_ID"
IMPL_SOURCE = "MAGPIE_IMPL_SOURCE"
# Where a profiled model's processes write their Chrome traces (serving's torch launcher).
TORCH_TRACE_DIR = "MAGPIE_TORCH_TRACE_DIR"
