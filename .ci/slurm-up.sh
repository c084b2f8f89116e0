#!/usr/bin/env bash
# Start (or stop) a one-node Slurm on this machine, without systemd, for the Slurm tests and for
# trying `snakemake --profile workflow/profiles/slurm` locally. Run as root. Idempotent.
#
#   .ci/slurm-up.sh          install slurm-wlm + munge if missing, write the config, start
#                            munged, slurmctld and slurmd, wait until the node is idle
#   .ci/slurm-up.sh --down   stop the three daemons started by this script (by their pid files)
#   .ci/slurm-up.sh --status print sinfo and exit 0 if the node accepts jobs
#
# Environment overrides: SLURM_MEM_HEADROOM_MB (memory kept from Slurm, default max(1024, 10 %)),
# SLURM_PARTITION (default "main"), SLURM_UP_TIMEOUT (seconds to wait for the node, default 60).
# GPUs listed by `nvidia-smi -L` are declared as GRES gpu so `--gpus=N` jobs get CUDA_VISIBLE_DEVICES.
set -euo pipefail

HOST=$(hostname)
PARTITION=${SLURM_PARTITION:-main}
TIMEOUT=${SLURM_UP_TIMEOUT:-60}
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
LOG_DIR=/var/log/slurm
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_PID=/run/munge/munged.pid

die() { echo "slurm-up: ERROR: $*" >&2; exit 1; }
say() { echo "slurm-up: $*"; }

alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() {  # stop exactly the daemon recorded in the pid file, wait for it to exit
    local pidfile=$1 name=$2 pid
    alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    pid=$(cat "$pidfile")
    say "stopping $name (pid $pid)"
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && { say "$name did not stop, sending SIGKILL"; kill -9 "$pid"; }
    rm -f "$pidfile"
}

down() {
    stop_pidfile $SLURMD_PID slurmd
    stop_pidfile $CTLD_PID slurmctld
    stop_pidfile $MUNGE_PID munged
}

node_state() { sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null | head -1; }

case "${1:-up}" in
    --down) down; exit 0 ;;
    --status) command -v sinfo >/dev/null || die "sinfo not installed"
              sinfo; [[ $(node_state) =~ ^(idle|mixed|allocated|completing) ]]; exit ;;
    up|--up) ;;
    *) die "unknown argument '$1' (use --down, --status or nothing)" ;;
esac

[[ $(id -u) == 0 ]] || die "must run as root (it installs packages and starts daemons)"

# ------------------------------------------------------------------ packages
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    say "installing slurm-wlm and munge with apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed (no network?)"
    # Package scripts try to start the services through init scripts; without systemd that may
    # fail harmlessly, and this script starts the daemons itself below.
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null \
        || die "apt-get install slurm-wlm munge failed"
fi
command -v slurmctld >/dev/null || die "slurmctld still missing after installing slurm-wlm"

# ------------------------------------------------------------------ munge
id munge >/dev/null 2>&1 || die "user 'munge' missing (the munge package creates it)"
install -d -o munge -g munge -m 700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 755 /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    say "writing a random /etc/munge/munge.key"
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
if ! alive $MUNGE_PID; then
    say "starting munged as user munge"
    runuser -u munge -- /usr/sbin/munged --pid-file=$MUNGE_PID || die "munged failed to start (see /var/log/munge/munged.log)"
fi
for _ in $(seq 25); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.2; done
munge -n </dev/null | unmunge >/dev/null 2>&1 || die "munge round trip failed: munged is not answering"

# ------------------------------------------------------------------ slurm.conf
CPUS=$(nproc)
TOTAL_MB=$(free -m | awk '/^Mem:/ {print $2}')
HEADROOM_MB=${SLURM_MEM_HEADROOM_MB:-$(( TOTAL_MB / 10 > 1024 ? TOTAL_MB / 10 : 1024 ))}
MEM_MB=$(( TOTAL_MB - HEADROOM_MB ))
(( MEM_MB > 0 )) || die "RealMemory would be $MEM_MB MB (total $TOTAL_MB, headroom $HEADROOM_MB)"

GRES_LINE="" NODE_GRES="" NGPUS=0
if command -v nvidia-smi >/dev/null && NGPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); then :; else NGPUS=0; fi
if (( NGPUS > 0 )); then
    GRES_LINE="GresTypes=gpu"
    NODE_GRES="Gres=gpu:$NGPUS"
fi

install -d -m 755 $CONF_DIR $LOG_DIR /var/spool/slurmctld /var/spool/slurmd
NEW=$(mktemp)
cat >"$NEW" <<EOF
# Written by .ci/slurm-up.sh: a one-node cluster on $HOST, no accounting database.
ClusterName=local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# squeue (the status command without accounting) sees finished jobs for MinJobAge seconds; the
# Snakemake plugin needs at least 3x its first status-check interval.
MinJobAge=600
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
$GRES_LINE
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB $NODE_GRES State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
if (( NGPUS > 0 )); then
    printf 'NodeName=%s Name=gpu File=/dev/nvidia[0-%d]\n' "$HOST" $(( NGPUS - 1 )) >$CONF_DIR/gres.conf
fi
# cgroup.conf is read by slurmd even with cgroup-free plugins in some versions; keep it harmless.
[[ -e $CONF_DIR/cgroup.conf ]] || echo "CgroupPlugin=autodetect" >$CONF_DIR/cgroup.conf

if ! cmp -s "$NEW" $CONF; then
    say "writing $CONF (CPUs=$CPUS RealMemory=${MEM_MB}MB GPUs=$NGPUS)"
    chmod 644 "$NEW"
    mv "$NEW" $CONF
    # Restart daemons of ours that run with an older config.
    stop_pidfile $SLURMD_PID slurmd
    stop_pidfile $CTLD_PID slurmctld
else
    rm -f "$NEW"
fi

# ------------------------------------------------------------------ daemons
if ! alive $CTLD_PID; then
    say "starting slurmctld"
    slurmctld || die "slurmctld failed to start; see $LOG_DIR/slurmctld.log:
$(tail -5 $LOG_DIR/slurmctld.log 2>/dev/null)"
fi
if ! alive $SLURMD_PID; then
    say "starting slurmd"
    slurmd || die "slurmd failed to start; see $LOG_DIR/slurmd.log:
$(tail -5 $LOG_DIR/slurmd.log 2>/dev/null)"
fi

deadline=$(( SECONDS + TIMEOUT ))
state=""
while (( SECONDS < deadline )); do
    state=$(node_state || true)
    case $state in
        idle|mixed|allocated|completing) say "node $HOST is $state: Slurm is up ($(sinfo -V))"; exit 0 ;;
        drained*|draining*|down*) scontrol update nodename="$HOST" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
done
die "node $HOST not idle after ${TIMEOUT}s (state: '${state:-no answer from slurmctld}').
  sinfo -R: $(sinfo -R -h 2>&1 | head -3)
  slurmctld.log: $(tail -3 $LOG_DIR/slurmctld.log 2>/dev/null)
  slurmd.log: $(tail -3 $LOG_DIR/slurmd.log 2>/dev/null)"
