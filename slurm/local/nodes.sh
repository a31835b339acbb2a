# Sourced by start.sh, stop.sh and on-node.sh: the hosts of a multi-node local cluster (start.sh --nodes N, N > 1).
#
# Each node is a host of its own on this one machine:
# - a network namespace (`ip netns`, /run/netns/rrnodeI) whose only interface besides lo is eth0, one end
#   of a veth pair; the other end is a port of the bridge rrslurm0 in the machine's own namespace, which
#   carries the controller's address. Addresses come from the benchmarking range 198.18.0.0/15 (RFC 2544:
#   never a real network): controller 198.18.0.1, node I 198.18.0.(10+I), all in 198.18.0.0/24. No
#   namespace has a default route and the machine does not forward, so nothing routes off the machine;
# - a UTS namespace (hostname rrnodeI) and a mount namespace holding a tmpfs on /tmp and on /dev/shm and
#   the cluster's hosts file bound over /etc/hosts; everything else (the project, run directories, the
#   state directory, munge's socket) is the machine's file system, shared as on a cluster. A project that
#   lies under /tmp (a CI checkout), and any path in RRTRAIN_SLURM_SHARED_PATHS (colon-separated), is bound
#   into the node's /tmp at its own path, so it stays shared.
# The UTS and mount namespaces live as long as a process of the node does (its slurmd, or a job step): a
# node whose processes all ended is gone with its mounts, and starting it again is a reboot (a fresh /tmp).
# shellcheck shell=bash

BRIDGE=rrslurm0
SUBNET_PREFIX=198.18.0
CTLD_ADDR=$SUBNET_PREFIX.1
NODE_PREFIX=rrnode

node_name() { echo "$NODE_PREFIX$1"; }       # node_name I
node_addr() { echo "$SUBNET_PREFIX.$((10 + $1))"; }
node_pidfile() { echo "$STATE/slurmd-$(node_name "$1").pid"; }

write_hosts() {  # write_hosts N CTLD_NAME: the hosts file every node sees as /etc/hosts
    local i
    {
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
        echo "$CTLD_ADDR $2"
        for ((i = 1; i <= $1; i++)); do echo "$(node_addr "$i") $(node_name "$i")"; done
    } >"$STATE/hosts.tmp"
    mv "$STATE/hosts.tmp" "$STATE/hosts"
}

make_bridge() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        echo "$BRIDGE" >>"$STATE/links"
    fi
    ip addr replace "$CTLD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
}

make_netns() {  # make_netns I: node I's network namespace and its veth pair (kept when it exists)
    local ns host_end
    ns=$(node_name "$1")
    host_end=rrveth$1
    if ! ip netns list | grep -qw "^$ns"; then
        ip netns add "$ns"
        echo "$ns" >>"$STATE/netns"
    fi
    if ! ip link show "$host_end" >/dev/null 2>&1; then
        ip link add "$host_end" type veth peer name eth0 netns "$ns"
        echo "$host_end" >>"$STATE/links"
    fi
    ip link set "$host_end" master "$BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr replace "$(node_addr "$1")/24" dev eth0
    ip -n "$ns" link set eth0 up
}

shared_under_tmp() {  # the shared paths that a node's private /tmp would hide, one a line
    local p extra=${RRTRAIN_SLURM_SHARED_PATHS:-}
    for p in "$PROJECT" ${extra//:/ }; do
        p=$(realpath -m "$p")
        [[ $p == /tmp/?* ]] && echo "$p"
    done
    return 0
}

start_node_slurmd() {  # start_node_slurmd I: slurmd of node I, in its namespaces (it daemonises itself)
    local name stage
    name=$(node_name "$1")
    stage=$STATE/host-tmp-$name  # a mount point inside the node only: the machine's /tmp, while it is bound
    mkdir -p "$STATE/spool/$name" "$stage"
    # The project (and RRTRAIN_SLURM_SHARED_PATHS) stay on the shared file system at their own paths, also
    # where they lie under /tmp (a CI checkout): each is bound from the machine's /tmp into the node's own.
    nsenter --net="/run/netns/$name" unshare --uts --mount --propagation private -- bash -c '
        set -e
        name=$1 hosts=$2 conf=$3 stage=$4
        shift 4
        hostname "$name"
        mount --bind /tmp "$stage"
        mount -t tmpfs -o mode=1777 "tmp-$name" /tmp
        for path in "$@"; do
            mkdir -p "$path"
            mount --bind "$stage/${path#/tmp/}" "$path"
        done
        umount "$stage"
        mount -t tmpfs -o mode=1777 "shm-$name" /dev/shm
        mount --bind "$hosts" /etc/hosts
        exec slurmd -c -f "$conf" -N "$name"' node "$name" "$STATE/hosts" "$CONF" "$stage" $(shared_under_tmp)
}

node_pid() {  # node_pid I: a live process of node I (its slurmd), to enter its namespaces; empty when none
    local pidfile pid
    pidfile=$(node_pidfile "$1")
    [[ -f $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    kill -0 "$pid" 2>/dev/null && echo "$pid"
    return 0
}
