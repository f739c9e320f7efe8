#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for the tests marked `slurm` (tests/workflow/test_slurm.py).
#
#   sudo bash .ci/slurm-cluster.sh start   # install (Debian: slurmctld slurmd slurm-client munge), configure, start
#   sudo bash .ci/slurm-cluster.sh stop    # cancel every job, stop slurmd, slurmctld and munged by their pid files
#
# Root only; no systemd needed (the daemons fork themselves and write /run/*.pid). The node advertises
# ATTNBENCH_FAKE_GPUS (default 2) GPUs as gres: character devices made with mknod (SLURM drops a GPU whose
# File= is missing, and sets no CUDA_VISIBLE_DEVICES for one that is a plain file). They are labels only:
# torch sees no CUDA device, so a sweep with `device: auto` runs its CPU grid here; what the fake GPUs test
# is SLURM's assignment (at most that many gpu=1 jobs at once, each with its own CUDA_VISIBLE_DEVICES).
# Without slurmdbd there is no sacct: profiles/slurm polls with squeue, and MinJobAge keeps finished jobs
# visible to it. EnforcePartLimits=ALL makes a request the node cannot meet fail at submission.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

GPUS=${ATTNBENCH_FAKE_GPUS:-2}
PARTITION=${ATTNBENCH_SLURM_PARTITION:-ci}
DEV_DIR=/var/spool/slurmd/fake-gpus
NODE=$(hostname -s)
PIDS=(/run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid)  # stopped in this order

say() { echo "slurm-cluster: $*"; }

install_packages() {
  local missing=()
  for pkg in slurmctld slurmd slurm-client munge; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

start_munge() {
  if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile /etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0; sleep 0.1; done
  say "munged did not answer"; return 1
}

write_config() {
  local cpus mem_mb
  cpus=$(nproc)
  mem_mb=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 85 / 100 ))
  mkdir -p "$DEV_DIR"
  for ((i = 0; i < GPUS; i++)); do
    [[ -c "$DEV_DIR/nvidia$i" ]] || { rm -f "$DEV_DIR/nvidia$i"; mknod "$DEV_DIR/nvidia$i" c 1 3; }
  done
  install -d -m 0755 /etc/slurm /var/spool/slurmd
  install -d -o slurm -g slurm -m 0755 /var/spool/slurmctld /var/log/slurm
  cat > /etc/slurm/slurm.conf <<EOF
# written by attnbench .ci/slurm-cluster.sh: one node, no accounting database
ClusterName=attnbench-ci
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
# backfill every second, not every 30 s: a small job waiting behind an exclusive one starts without that wait
SchedulerParameters=bf_interval=1
ReturnToService=2
MinJobAge=3600
KillWait=10
DefMemPerCPU=1000
EnforcePartLimits=ALL
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
GresTypes=gpu
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem_mb} Gres=gpu:${GPUS} State=UNKNOWN
PartitionName=${PARTITION} Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP
EOF
  cat > /etc/slurm/gres.conf <<EOF
AutoDetect=off
NodeName=${NODE} Name=gpu File=${DEV_DIR}/nvidia[0-$((GPUS - 1))]
EOF
}

wait_idle() {
  local state=""
  for _ in $(seq 120); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
    [[ "$state" == idle ]] && return 0
    sleep 0.5
  done
  say "node $NODE is '$state', not idle"
  tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log || true
  return 1
}

start() {
  [[ $(id -u) == 0 ]] || { say "start needs root"; exit 1; }
  install_packages
  start_munge
  write_config
  slurmctld -c  # a clean state: no jobs or node states from an earlier run
  slurmd
  wait_idle
  sinfo -N -o '%N %T %c %m %G'
  say "up: partition $PARTITION, $GPUS fake GPUs (slurmctld pid $(cat /run/slurmctld.pid), slurmd pid $(cat /run/slurmd.pid))"
}

stop_pid() {  # $1: a pid file; the process it names is stopped with SIGTERM, then waited for
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && { say "pid $pid ($1) is still running"; return 1; }
    say "stopped pid $pid ($1)"
  fi
  rm -f "$1"  # slurmctld cannot remove its own root-owned pid file
}

stop() {
  scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
  local status=0
  for pidfile in "${PIDS[@]}"; do stop_pid "$pidfile" || status=1; done
  return $status
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
