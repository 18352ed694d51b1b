# Sourced (`. tools/device_env.sh`) by the device scripts, from the repository root: the
# environment every device call runs in -- the checkout on the import path, unbuffered output
# (the logs come back even from a call cut by its time limit), a headless matplotlib, the
# kernel cache under /tmp (kept while the machine stays warm) -- and `stamp`, which prefixes a
# line with the seconds since the script started.
export PYTHONPATH=. PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/fa_cupy_cache}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
