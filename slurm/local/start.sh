#!/usr/bin/env bash
# Start a real Slurm cluster on this machine, as root: for tests (tests/slurm/) and laptops.
#
#   slurm/local/start.sh             # one node: this machine (installs slurmctld/slurmd/slurm-client/munge when missing)
#   slurm/local/start.sh --nodes N   # N nodes, each a host of its own (network, UTS and mount namespaces; nodes.sh)
#   slurm/local/stop.sh              # stops what this script started and removes its files, namespaces and links
#   slurm/local/on-node.sh I CMD...  # runs CMD on node I of a multi-node cluster (as if logged in there)
#
# Idempotent: when the cluster this script started is already up with the same number of nodes and answering,
# it is reused (a node whose slurmd died is started again); a cluster of another size is stopped first.
# With N > 1 the controller listens on the bridge address 198.18.0.1 and node I is rrnodeI at 198.18.0.(10+I),
# one partition `debug` over all of them; every node is declared with all of this machine's CPUs (they share
# them) and 1/N of its memory. Submit from this machine (sbatch, squeue, scancel, scontrol); srun works inside
# jobs. A failed start stops what it started.
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
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROJECT=$(cd "$HERE/../.." && pwd)  # the checkout: on the shared file system of every node
CTLD=$(hostname -s)
WAIT_S=${RRTRAIN_SLURM_WAIT_S:-60}

say() { echo "slurm/local/start.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

NODES=1
while (($#)); do
    case $1 in
        --nodes) NODES=${2:-}; shift 2 || die "--nodes needs a number" ;;
        --nodes=*) NODES=${1#--nodes=}; shift ;;
        -h | --help) sed -n '2,/^set -euo/{/^set/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) say "error: unknown argument '$1' (usage: start.sh [--nodes N])"; exit 2 ;;
    esac
done
[[ $NODES =~ ^[0-9]+$ ]] && ((NODES >= 1 && NODES <= 32)) || { say "error: --nodes wants 1 to 32, not '$NODES'"; exit 2; }

[[ $(id -u) -eq 0 ]] || die "run as root (it installs packages and starts daemons)"
# shellcheck source=nodes.sh
source "$HERE/nodes.sh"

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

node_names() {  # the cluster's node names, one a line
    local i
    if ((NODES == 1)); then echo "$CTLD"; return; fi
    for ((i = 1; i <= NODES; i++)); do node_name "$i"; done
}

node_idle() {  # node_idle NAME
    # A node is schedulable once sinfo reports it idle (or already running jobs of an earlier start).
    local state
    state=$(SLURM_CONF=$CONF sinfo -h -n "$1" -o '%t' 2>/dev/null | head -n1)
    [[ $state == idle || $state == mix || $state == alloc || $state == comp ]]
}

all_idle() {
    local n
    for n in $(node_names); do node_idle "$n" || return 1; done
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
    # one apt-get at a time on this machine (a test suite may install chromium meanwhile): a shared lock file
    local apt=(flock /var/lock/rrtrain-apt.lock env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
    "${apt[@]}" update -qq
    "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
    # GNU nproc honours OMP_NUM_THREADS (tests set it to 1): count the CPUs this machine gives us instead.
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
    # Leave 10% of the memory (and at least 512 MB) to the system and the daemons.
    mem_mb=$(awk '/^MemTotal:/ { m = int($2 / 1024); r = int(m * 0.9); if (m - r < 512) r = m - 512; print r }' /proc/meminfo)
    mkdir -p "$STATE/spool" "$STATE/ctld" "$STATE/log"
    local ctld_addr=127.0.0.1 slurmd_files nodes_lines i
    if ((NODES == 1)); then
        slurmd_files="SlurmdSpoolDir=$STATE/spool
SlurmdPidFile=$STATE/slurmd.pid
SlurmdLogFile=$STATE/log/slurmd.log"
        nodes_lines="NodeName=$CTLD NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN"
    else
        ctld_addr=$CTLD_ADDR
        mem_mb=$((mem_mb / NODES))
        # %n: the node's name (one slurmd per node on this machine); its memory is not checked against the
        # machine's (config_overrides): the nodes share the machine.
        slurmd_files="SlurmdSpoolDir=$STATE/spool/%n
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmdParameters=config_overrides"
        nodes_lines=""
        for ((i = 1; i <= NODES; i++)); do
            nodes_lines+="NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN"$'\n'
        done
    fi
    cat >"$CONF.tmp" <<CONF
# Written by slurm/local/start.sh; removed by slurm/local/stop.sh. $NODES node(s), one partition, no accounting.
ClusterName=rrtrain-local
SlurmctldHost=$CTLD($ctld_addr)
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
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
$slurmd_files
SlurmctldDebug=info
SlurmdDebug=info
# Without a default, a job that asks for no memory is given the whole node and runs alone.
DefMemPerCPU=$((mem_mb / cpus))
$nodes_lines
PartitionName=debug Nodes=$(node_names | paste -sd, -) Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
    echo "$NODES" >"$STATE/nodes"
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

slurmds_alive() {
    local i
    if ((NODES == 1)); then alive "$STATE/slurmd.pid"; return; fi
    for ((i = 1; i <= NODES; i++)); do alive "$(node_pidfile "$i")" || return 1; done
}

start_slurmds() {  # every slurmd not running: the machine's own (one node), or one per node in its namespaces
    local i
    if ((NODES == 1)); then slurmd -c -f "$CONF"; return; fi
    make_bridge
    for ((i = 1; i <= NODES; i++)); do
        if alive "$(node_pidfile "$i")"; then  # started earlier, maybe from another checkout
            nsenter --target "$(node_pid "$i")" --mount test -e "$HERE/start.sh" ||
                die "node $(node_name "$i") runs without this checkout ($PROJECT) on its file system: run stop.sh first"
            continue
        fi
        make_netns "$i"
        start_node_slurmd "$i"
    done
}

wait_idle() {
    local deadline=$((SECONDS + WAIT_S))
    until all_idle; do
        if ((SECONDS > deadline)); then
            tail -n 20 "$STATE"/log/*.log >&2 || true
            die "nodes $(node_names | paste -sd, -) not all idle in ${WAIT_S} s (logs in $STATE/log)"
        fi
        sleep 0.5
    done
}

mkdir -p "$STATE"
running_nodes=$(cat "$STATE/nodes" 2>/dev/null || echo 1)
if alive "$STATE/slurmctld.pid" && [[ $running_nodes != "$NODES" ]]; then
    say "a $running_nodes-node cluster is running: stopping it for $NODES nodes"
    bash "$HERE/stop.sh"
    mkdir -p "$STATE"
elif alive "$STATE/slurmctld.pid" && [[ -f $CONF ]]; then
    export SLURM_CONF=$CONF
    if ! slurmds_alive; then
        say "starting the slurmd of nodes that are down"
        start_slurmds
        scontrol update NodeName="$(node_names | paste -sd, -)" State=RESUME >/dev/null 2>&1 || true
        wait_idle
    fi
    if all_idle; then
        say "already running (state in $STATE)"
        echo "SLURM_CONF=$CONF"
        exit 0
    fi
fi

install_packages
start_munge
# Start fresh: a half-started earlier attempt is stopped first (its state directory is kept).
for pidfile in "$STATE"/slurmd*.pid "$STATE/slurmctld.pid"; do
    if alive "$pidfile"; then kill "$(cat "$pidfile")"; sleep 1; fi
done
# A start that fails part-way leaves nothing behind (no namespace, daemon or link); the packages stay.
trap 'status=$?; if ((status != 0)); then say "start failed: stopping what it started"; bash "$HERE/stop.sh" || true; fi' EXIT
write_conf
export SLURM_CONF=$CONF
((NODES > 1)) && write_hosts "$NODES" "$CTLD"
# -c: forget jobs of an earlier cluster; -i: ignore stale state. The daemons daemonise themselves.
slurmctld -c -i -f "$CONF"
start_slurmds
wait_idle
trap - EXIT
say "cluster up: $NODES node(s) $(node_names | paste -sd, -), partition debug, $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) CPUs each (state in $STATE)"
echo "SLURM_CONF=$CONF"
