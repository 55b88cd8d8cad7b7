#!/usr/bin/env bash
# Entrypoint of the gtopk-lab image (scheduler, workers and JupyterLab alike).
#
#   entrypoint.sh COMMAND [ARGS...]      e.g. entrypoint.sh dask worker tls://scheduler:8786 ...
#
# 1. Traffic shaping (optional, workers): when GTOPK_SHAPE_BANDWIDTH is set, run
#    shape-traffic.sh (tbf rate limit + netem delay from GTOPK_SHAPE_DELAY) on
#    GTOPK_SHAPE_IFACE (default: the default route's interface). Needs NET_ADMIN
#    (compose: cap_add: [NET_ADMIN]). A failure stops the container: an experiment that
#    silently runs unshaped is worse than none.
# 2. When shaping is on, force the collective libraries onto that interface's sockets,
#    because tc only sees socket traffic (values already set in the environment win):
#      GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME = the shaped interface
#      NCCL_IB_DISABLE=1                      no InfiniBand/RoCE verbs (bypass the kernel)
#      NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1  no NVLink/PCIe/shared memory between GPUs
#                                             of one machine
# 3. exec COMMAND: it replaces this shell, so SIGTERM from `docker stop` / Kubernetes
#    reaches dask directly (tini, the image's PID 1, forwards signals and reaps zombies).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
shaper="${GTOPK_SHAPE_SCRIPT:-$here/shape-traffic.sh}"

if [[ $# -eq 0 ]]; then
  echo "entrypoint: error: no command given (e.g. dask scheduler, dask worker ADDRESS, jupyter lab)" >&2
  exit 2
fi

if [[ -n "${GTOPK_SHAPE_BANDWIDTH:-}" ]]; then
  if [[ -z "${GTOPK_SHAPE_IFACE:-}" ]]; then
    GTOPK_SHAPE_IFACE="$(ip -o route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')"
    GTOPK_SHAPE_IFACE="${GTOPK_SHAPE_IFACE:-eth0}"
  fi
  export GTOPK_SHAPE_IFACE
  "$shaper" "$GTOPK_SHAPE_BANDWIDTH" "${GTOPK_SHAPE_DELAY:-}"
  export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$GTOPK_SHAPE_IFACE}"
  export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$GTOPK_SHAPE_IFACE}"
  export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
  export NCCL_P2P_DISABLE="${NCCL_P2P_DISABLE:-1}"
  export NCCL_SHM_DISABLE="${NCCL_SHM_DISABLE:-1}"
fi

exec "$@"
