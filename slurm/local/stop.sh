#!/usr/bin/env bash
# Stop the one-node Slurm cluster that slurm/local/start.sh started and remove what it created: the
# daemons it started (by their pid files), its state directory, the /etc/slurm/slurm.conf symlink when it
# points into that directory, and the munge key when start.sh made it. Installed packages stay.
# Jobs still running on the cluster are cancelled first. Safe to run when nothing is running.
set -uo pipefail

STATE=${RRTRAIN_SLURM_DIR:-/var/tmp/rrtrain-slurm}
CONF=$STATE/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf

say() { echo "slurm/local/stop.sh: $*" >&2; }

[[ $(id -u) -eq 0 ]] || { say "error: run as root"; exit 1; }
[[ -d $STATE ]] || { say "nothing to stop ($STATE does not exist)"; exit 0; }

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
stop_pidfile slurmd "$STATE/slurmd.pid"
stop_pidfile slurmctld "$STATE/slurmctld.pid"
stop_pidfile munged "$STATE/munged.pid"   # only when start.sh started munged

if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then rm -f "$ETC_CONF"; fi
if [[ -f $STATE/created-munge-key ]]; then rm -f /etc/munge/munge.key; fi
rm -rf "$STATE"
say "stopped; removed $STATE"
