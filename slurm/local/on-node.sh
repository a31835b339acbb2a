#!/usr/bin/env bash
# Run a command on node I of the multi-node local cluster (slurm/local/start.sh --nodes N), as if logged in
# there: in the node's network, UTS and mount namespaces (its address, hostname, /tmp and /dev/shm), entered
# through its slurmd. For tests and debugging, e.g. `slurm/local/on-node.sh 2 hostname`.
set -euo pipefail

STATE=${RRTRAIN_SLURM_DIR:-/var/tmp/rrtrain-slurm}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=nodes.sh
source "$HERE/nodes.sh"

(($# >= 2)) && [[ $1 =~ ^[0-9]+$ ]] || { echo "usage: on-node.sh I COMMAND [ARG ...]" >&2; exit 2; }
pid=$(node_pid "$1")
[[ -n $pid ]] || { echo "on-node.sh: node $(node_name "$1") has no slurmd running (not started, or down)" >&2; exit 1; }
shift
exec nsenter --target "$pid" --net --uts --mount -- "$@"
