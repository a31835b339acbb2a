#!/usr/bin/env bash
# Stop the Slurm cluster that slurm/local/start.sh started (one node or --nodes N) and remove what it created:
# the daemons it started (by their pid files), every process left in a node's namespaces (job steps and ranks
# of a node whose slurmd died), the nodes' network namespaces, veth pairs and bridge, its state directory, the
# /etc/slurm/slurm.conf symlink when it points into that directory, and the munge key when start.sh made it.
# A node's /tmp, /dev/shm and hosts mounts exist only in its mount namespace and end with its last process.
# Installed packages stay. Jobs still running are cancelled first. Safe to run when nothing is running.
set -uo pipefail

STATE=${RRTRAIN_SLURM_DIR:-/var/tmp/rrtrain-slurm}
CONF=$STATE/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

say() { echo "slurm/local/stop.sh: $*" >&2; }

[[ $(id -u) -eq 0 ]] || { say "error: run as root"; exit 1; }
[[ -d $STATE ]] || { say "nothing to stop ($STATE does not exist)"; exit 0; }
# shellcheck source=nodes.sh
source "$HERE/nodes.sh"

stop_pidfile() {  # stop_pidfile NAME PIDFILE: TERM, wait up to 10 s, then KILL
    local pid
    [[ -f $2 ]] || return 0
    pid=$(cat "$2")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then say "$1 ($pid) ignored TERM; killing"; kill -9 "$pid"; fi
    fi
    rm -f "$2"
}

if [[ -f $STATE/slurmctld.pid ]] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; then
    SLURM_CONF=$CONF scancel --quiet --full --user=root 2>/dev/null || true
    sleep 1
fi
for pidfile in "$STATE"/slurmd*.pid; do
    [[ -e $pidfile ]] && stop_pidfile "$(basename "$pidfile" .pid)" "$pidfile"
done
stop_pidfile slurmctld "$STATE/slurmctld.pid"
stop_pidfile munged "$STATE/munged.pid"   # only when start.sh started munged

# The nodes: whatever still runs in a node's network namespace (slurmstepd, ranks) is killed, then the
# namespace, its veth pair and the bridge go.
if [[ -f $STATE/netns ]]; then
    while read -r ns; do
        [[ -n $ns ]] || continue
        pids=$(ip netns pids "$ns" 2>/dev/null)
        if [[ -n $pids ]]; then
            # shellcheck disable=SC2086
            kill -9 $pids 2>/dev/null
            for _ in $(seq 50); do [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break; sleep 0.1; done
        fi
        ip netns del "$ns" 2>/dev/null || true
    done <"$STATE/netns"
fi
if [[ -f $STATE/links ]]; then
    while read -r link; do
        [[ -n $link ]] && ip link show "$link" >/dev/null 2>&1 && ip link del "$link"
    done <"$STATE/links"
fi

if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then rm -f "$ETC_CONF"; fi
if [[ -f $STATE/created-munge-key ]]; then rm -f /etc/munge/munge.key; fi
rm -rf "$STATE"
say "stopped; removed $STATE"
