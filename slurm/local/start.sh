#!/usr/bin/env bash
# Start a real one-node Slurm cluster on this machine, as root: for tests (tests/slurm/) and laptops.
#
#   slurm/local/start.sh          # installs Debian's slurmctld/slurmd/slurm-client/munge when missing
#   slurm/local/stop.sh           # stops what this script started and removes its files
#
# Idempotent: when the cluster this script started is already up and answering, it is reused.
# Everything lives in one state directory ($RRTRAIN_SLURM_DIR, default /var/tmp/rrtrain-slurm): slurm.conf,
# logs, pid files, spool and controller state. /etc/slurm/slurm.conf is a symlink to our slurm.conf (made
# only when that path is free or already ours), so sbatch/squeue/submitit work without SLURM_CONF; the
# last line printed is `SLURM_CONF=...` for shells that prefer to export it.
#
# What is particular about the machines this was written on (Debian 12, Slurm 22.05, a gVisor sandbox):
# - no systemd as PID 1: the daemons are started here directly, not through service units;
# - cgroups are a mix of v1 controllers and an empty v2 tree that Slurm cannot manage, so process
#   tracking is proctrack/linuxproc (parent-pid walk) and task/none (no binding, no cgroup limits);
#   memory limits are therefore not enforced, only scheduled;
# - the hostname (`hostname -s`) resolves to 127.0.0.1 in /etc/hosts; the node is addressed as 127.0.0.1.
set -euo pipefail

STATE=${RRTRAIN_SLURM_DIR:-/var/tmp/rrtrain-slurm}
CONF=$STATE/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)
WAIT_S=${RRTRAIN_SLURM_WAIT_S:-60}

say() { echo "slurm/local/start.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (it installs packages and starts daemons)"

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

node_idle() {
    # The node is schedulable once sinfo reports it idle (or already running jobs of an earlier start).
    local state
    state=$(SLURM_CONF=$CONF sinfo -h -n "$NODE" -o '%t' 2>/dev/null | head -n1)
    [[ $state == idle || $state == mix || $state == alloc || $state == comp ]]
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    ((${#missing[@]} == 0)) && return
    say "installing ${missing[*]}"
    # The packages' postinst scripts try to start services; there is no init system to start them with,
    # and we start the daemons ourselves below, so forbid it.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; made_policy=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    ((made_policy)) && rm -f "$policy"
    return 0
}

start_munge() {
    # Debian's package creates /etc/munge/munge.key; make one when it is missing. Clients find munged
    # at its default socket, so munged keeps the default paths and only its pid file is ours.
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "creating /etc/munge/munge.key"
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        touch "$STATE/created-munge-key"
    fi
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return  # a munged is already answering (ours from an earlier start, or the system's)
    fi
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    # munged runs as the key's owner (user munge); --force accepts this sandbox's permissive /run.
    runuser -u munge -- munged --force --pid-file=/run/munge/munged.pid
    cp /run/munge/munged.pid "$STATE/munged.pid" 2>/dev/null || pgrep -n -x munged >"$STATE/munged.pid"
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
    die "munged did not start (see /var/log/munge/munged.log)"
}

write_conf() {
    local cpus mem_mb
    cpus=$(nproc)
    # Leave 10% of the memory (and at least 512 MB) to the system and the daemons.
    mem_mb=$(awk '/^MemTotal:/ { m = int($2 / 1024); r = int(m * 0.9); if (m - r < 512) r = m - 512; print r }' /proc/meminfo)
    mkdir -p "$STATE/spool" "$STATE/ctld" "$STATE/log"
    cat >"$CONF.tmp" <<CONF
# Written by slurm/local/start.sh; removed by slurm/local/stop.sh. One node, one partition, no accounting.
ClusterName=rrtrain-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again only after the job credential expires (default 120 s); tests requeue.
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
JobRequeue=1
# Short timeouts for tests: a job past its limit gets SIGTERM, then SIGKILL KillWait s later (time enough for a
# small checkpoint); finished jobs stay visible in squeue for MinJobAge s (no sacct here: squeue is all there is).
KillWait=15
MinJobAge=300
OverTimeLimit=0
InactiveLimit=0
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
Waittime=0
SchedulerParameters=sched_interval=2,bf_interval=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# Without a default, a job that asks for no memory is given the whole node and runs alone.
DefMemPerCPU=$((mem_mb / cpus))
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
    mv "$CONF.tmp" "$CONF"
    mkdir -p /etc/slurm
    if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
        :
    elif [[ ! -e $ETC_CONF && ! -L $ETC_CONF ]]; then
        ln -s "$CONF" "$ETC_CONF"
    else
        say "$ETC_CONF exists and is not ours: leaving it; export SLURM_CONF=$CONF"
    fi
}

mkdir -p "$STATE"
if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid" && node_idle; then
    say "already running (state in $STATE)"
    echo "SLURM_CONF=$CONF"
    exit 0
fi

install_packages
start_munge
# Start fresh: a half-started earlier attempt is stopped first (its state directory is kept).
for d in slurmd slurmctld; do
    if alive "$STATE/$d.pid"; then kill "$(cat "$STATE/$d.pid")"; sleep 1; fi
done
write_conf
export SLURM_CONF=$CONF
# -c: forget jobs of an earlier cluster; -i: ignore stale state. Both daemons daemonise themselves.
slurmctld -c -i -f "$CONF"
slurmd -c -f "$CONF"

deadline=$((SECONDS + WAIT_S))
until node_idle; do
    if ((SECONDS > deadline)); then
        tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
        die "node $NODE did not become idle in ${WAIT_S} s (logs in $STATE/log)"
    fi
    sleep 0.5
done
say "cluster up: node $NODE, partition debug, $(nproc) CPUs (state in $STATE)"
echo "SLURM_CONF=$CONF"
