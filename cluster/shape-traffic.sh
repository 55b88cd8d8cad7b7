#!/usr/bin/env bash
# Shape this machine's (container's) outgoing traffic on one interface with Linux tc:
# a token-bucket filter (tbf) caps the rate at BANDWIDTH, and, where the kernel has the
# sch_netem module, a netem qdisc in front of it adds a fixed one-way DELAY per packet.
#
#   shape-traffic.sh [--dry-run] [--clear] BANDWIDTH [DELAY]
#   or with the environment: GTOPK_SHAPE_BANDWIDTH, GTOPK_SHAPE_DELAY
#
#   BANDWIDTH  a bit rate: 1gbit, 200mbit, 500kbit (tc's spelling) or 1Gbps, 100Mbps
#              (networking spelling; here "bps" means BITS per second, as in gtopk-lab's
#              RunConfig.bandwidth, whereas tc's own "mbps" would mean megaBYTES per second:
#              the script always hands tc a plain number of bit/s to avoid that trap).
#   DELAY      one-way delay per packet: 500us, 2ms (needs sch_netem; the script fails
#              rather than silently running without the delay you asked for).
#
# Other settings (environment):
#   GTOPK_SHAPE_IFACE          interface to shape (default: the one of the default route,
#                              else eth0). Use "lo" for single-machine experiments.
#   GTOPK_SHAPE_BURST          tbf bucket size (default: 10 ms worth of BANDWIDTH, at least
#                              32kb); too small a bucket caps the rate below BANDWIDTH.
#   GTOPK_SHAPE_QUEUE_LATENCY  longest a packet may wait in the tbf queue before it is
#                              dropped (default 1000ms; TCP slows down instead of losing).
#
# Cost: two tc calls at start-up; tbf then costs a token check per packet in the kernel.
# Needs CAP_NET_ADMIN: root, or the container started with --cap-add NET_ADMIN (the
# gtopk-lab image gives /sbin/tc that file capability so the unprivileged user can run it).
#
# Caveats (see cluster/README.md): tc shapes EGRESS only, so shape every worker; on
# loopback all ranks share one shaped link; NCCL bypasses sockets (and so the shaper)
# unless NCCL_IB_DISABLE=1 and, between GPUs of one machine, NCCL_P2P_DISABLE=1
# NCCL_SHM_DISABLE=1 (cluster/entrypoint.sh sets these when shaping is on).
set -euo pipefail

die() { echo "shape-traffic: error: $*" >&2; exit 2; }

dry_run=0
clear_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --clear) clear_only=1; shift ;;
    -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option $1 (allowed: --dry-run, --clear, --help)" ;;
    *) break ;;
  esac
done
bandwidth="${1:-${GTOPK_SHAPE_BANDWIDTH:-}}"
delay="${2:-${GTOPK_SHAPE_DELAY:-}}"

iface="${GTOPK_SHAPE_IFACE:-}"
if [[ -z "$iface" ]]; then
  iface="$(ip -o route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')"
  iface="${iface:-eth0}"
fi
[[ "$iface" =~ ^[A-Za-z0-9_.@:-]{1,15}$ ]] || die "GTOPK_SHAPE_IFACE='$iface' is not an interface name"

run() {
  if [[ $dry_run -eq 1 ]]; then echo "$*"; else "$@"; fi
}

if [[ $clear_only -eq 1 ]]; then
  run tc qdisc del dev "$iface" root 2>/dev/null || true
  exit 0
fi
[[ -n "$bandwidth" ]] || die "BANDWIDTH is missing: pass it as the first argument or set GTOPK_SHAPE_BANDWIDTH (e.g. 1gbit, 100Mbps)"

# BANDWIDTH -> integer bit/s. Units are decimal (k = 1e3) as in tc and in networking.
to_bits_per_s() {
  local text="$1" number unit factor
  if [[ "$text" =~ ^([0-9]+(\.[0-9]+)?)[[:space:]]*([A-Za-z/]*)$ ]]; then
    number="${BASH_REMATCH[1]}"; unit="${BASH_REMATCH[3],,}"
  else
    return 1
  fi
  case "$unit" in
    bit|bps|b/s|bit/s) factor=1 ;;
    kbit|kbps|kb/s|kbit/s) factor=1000 ;;
    mbit|mbps|mb/s|mbit/s) factor=1000000 ;;
    gbit|gbps|gb/s|gbit/s|gbe) factor=1000000000 ;;
    tbit|tbps|tb/s|tbit/s) factor=1000000000000 ;;
    *) return 1 ;;
  esac
  awk -v n="$number" -v f="$factor" 'BEGIN { v = n * f; if (v < 8000) exit 1; printf "%.0f\n", v }'
}
rate_bps="$(to_bits_per_s "$bandwidth")" \
  || die "bandwidth='$bandwidth' is invalid: expected a bit rate >= 8kbit such as 200mbit, 1gbit, 100Mbps, 10Gbps"

# DELAY -> tc time (microseconds, integer), validated.
delay_us=""
if [[ -n "$delay" && "$delay" != "0" && "$delay" != "none" ]]; then
  if [[ "$delay" =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]]; then
    delay_us="$(awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" \
      'BEGIN { f = (u == "us") ? 1 : (u == "ms") ? 1000 : 1000000; printf "%.0f\n", n * f }')"
  else
    die "delay='$delay' is invalid: expected a time such as 500us, 0.5ms, 2ms"
  fi
fi

burst="${GTOPK_SHAPE_BURST:-}"
if [[ -z "$burst" ]]; then
  # 10 ms worth of tokens, in bytes, at least 32 KiB (more than one 64 KiB-MTU loopback
  # packet needs; tbf drops packets larger than the bucket).
  burst="$(awk -v r="$rate_bps" 'BEGIN { b = r / 8 / 100; if (b < 32768) b = 32768; printf "%.0f\n", b }')b"
fi
queue_latency="${GTOPK_SHAPE_QUEUE_LATENCY:-1000ms}"
[[ "$burst" =~ ^[0-9]+(b|kb|mb|k|m)?$ ]] || die "GTOPK_SHAPE_BURST='$burst' is invalid: expected a size such as 256kb"
[[ "$queue_latency" =~ ^[0-9]+(us|ms|s)$ ]] || die "GTOPK_SHAPE_QUEUE_LATENCY='$queue_latency' is invalid: expected a time such as 1000ms"

if [[ $dry_run -eq 0 ]]; then
  command -v tc >/dev/null || die "tc not found: install iproute2"
  ip link show dev "$iface" >/dev/null 2>&1 || die "interface '$iface' does not exist (set GTOPK_SHAPE_IFACE)"
fi

# Idempotent: remove whatever root qdisc an earlier run installed.
run tc qdisc del dev "$iface" root 2>/dev/null || true
if [[ -n "$delay_us" ]]; then
  run tc qdisc add dev "$iface" root handle 1: netem delay "${delay_us}us" \
    || die "could not add 'netem delay ${delay_us}us' on $iface: this kernel lacks sch_netem (unset GTOPK_SHAPE_DELAY to shape bandwidth only)"
  run tc qdisc add dev "$iface" parent 1:1 handle 10: tbf rate "${rate_bps}bit" burst "$burst" latency "$queue_latency"
else
  run tc qdisc add dev "$iface" root handle 1: tbf rate "${rate_bps}bit" burst "$burst" latency "$queue_latency"
fi
if [[ $dry_run -eq 0 ]]; then
  echo "shape-traffic: $iface egress limited to ${rate_bps} bit/s${delay_us:+, +${delay_us} us delay}:" >&2
  tc qdisc show dev "$iface" >&2
fi
