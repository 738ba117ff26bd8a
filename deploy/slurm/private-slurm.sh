#!/bin/bash
# A private single-node Slurm on this machine, for tests/test_slurm.sh and
# deploy/slurm/run-by-hand.sh --private: munged, slurmctld and slurmd run as
# processes of the caller (root), each with its own state, spool, log and
# socket files under DIR and non-default ports, so nothing collides with a
# system Slurm or munge.
#   private-slurm.sh start DIR [--cpus N] [--port P]   writes DIR/slurm.conf, starts the
#       daemons, waits (bounded) until the node is idle; prints `SLURM_CONF=DIR/slurm.conf`.
#       Exit 0 up, 77 when it cannot start here (the line starting `SKIP:` says why), 1 an error.
#   private-slurm.sh stop DIR    ends the daemons it started (by the PIDs in DIR/*.pid), bounded
# Needs: root, Debian's slurm-wlm (22.05) and munge. No cgroups: proctrack/linuxproc,
# task/none, no accounting; the node's CPU count is taken from the config (config_overrides).
set -uo pipefail
skip() { echo "SKIP: $*"; exit 77; }
cmd=${1:-}; D=${2:-}
case "$cmd" in
  start|stop) [ -n "$D" ] || { echo "private-slurm.sh: $cmd needs DIR" >&2; exit 2; } ;;
  -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: private-slurm.sh start|stop DIR (try --help)" >&2; exit 2 ;;
esac
shift 2
CPUS=4 PORT=26817
while [ $# -gt 0 ]; do
  case "$1" in
    --cpus|--port) [ $# -ge 2 ] || { echo "private-slurm.sh: $1 needs a value" >&2; exit 2; } ;;&
    --cpus) CPUS=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    *) echo "private-slurm.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$CPUS$PORT" in *[!0-9]*|"") echo "private-slurm.sh: --cpus and --port take numbers" >&2; exit 2 ;; esac
[ "$CPUS" -ge 1 ] && [ "$CPUS" -le 256 ] || { echo "private-slurm.sh: --cpus must be 1..256" >&2; exit 2; }
[ "$PORT" -ge 1024 ] && [ "$PORT" -le 65000 ] || { echo "private-slurm.sh: --port must be 1024..65000" >&2; exit 2; }

stop_pid() { # NAME: TERM, then KILL after a bounded wait, by the PID in DIR/NAME.pid
  local f="$D/$1.pid" p i
  [ -f "$f" ] || return 0
  p=$(cat "$f"); case "$p" in ''|*[!0-9]*) rm -f "$f"; return 0 ;; esac
  kill -TERM "$p" 2>/dev/null || { rm -f "$f"; return 0; }
  for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
  for i in $(seq 1 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  rm -f "$f"
}
if [ "$cmd" = stop ]; then
  stop_pid slurmd; stop_pid slurmctld; stop_pid munged
  exit 0
fi

[ "$(id -u)" = 0 ] || skip "a private Slurm needs root (slurmd runs job steps as their user), running as uid $(id -u)"
for b in munged mungekey slurmctld slurmd sbatch srun scancel scontrol sinfo; do
  command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || skip "$b is not installed (apt-get install slurm-wlm munge, or deploy/setup.sh --with-slurm)"
done
PATH=$PATH:/usr/sbin
NODE=$(hostname -s)
mkdir -p "$D"/{state,spool,log,munge}
chmod 0700 "$D" "$D/munge"
# munge: its own key, socket, pid and seed files (munged refuses group/other-writable dirs)
mungekey --create --keyfile="$D/munge/munge.key" --force >/dev/null 2>&1 \
  || dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
chmod 0400 "$D/munge/munge.key"
munged -F --force --socket="$D/munge/munge.sock" --key-file="$D/munge/munge.key" \
  --pid-file="$D/munge/munged.pidfile" --log-file="$D/log/munged.log" --seed-file="$D/munge/munged.seed" \
  > "$D/log/munged.out" 2>&1 &
echo $! > "$D/munged.pid"
for _ in $(seq 1 50); do [ -S "$D/munge/munge.sock" ] && break; kill -0 "$(cat "$D/munged.pid")" 2>/dev/null || break; sleep 0.1; done
[ -S "$D/munge/munge.sock" ] || { tail -n 5 "$D/log/munged.out" "$D/log/munged.log" 2>/dev/null; "$0" stop "$D"; skip "munged did not start here (log above)"; }

cat > "$D/slurm.conf" <<CONF
# private single-node Slurm written by deploy/slurm/private-slurm.sh
ClusterName=dlocotest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$D/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pidfile
SlurmdPidFile=$D/slurmd.pidfile
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
InactiveLimit=0
MinJobAge=300
RebootProgram=/bin/false
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=dloco Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
export SLURM_CONF="$D/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" > "$D/log/slurmctld.out" 2>&1 &
echo $! > "$D/slurmctld.pid"
slurmd -D -f "$SLURM_CONF" -N "$NODE" > "$D/log/slurmd.out" 2>&1 &
echo $! > "$D/slurmd.pid"
state=""
for _ in $(seq 1 150); do
  state=$(sinfo -h -N -n "$NODE" -o '%t' 2>/dev/null | head -n 1)
  [ "$state" = idle ] && break
  kill -0 "$(cat "$D/slurmctld.pid")" 2>/dev/null || break
  kill -0 "$(cat "$D/slurmd.pid")" 2>/dev/null || break
  sleep 0.2
done
if [ "$state" != idle ]; then
  tail -n 8 "$D/log/slurmctld.log" "$D/log/slurmd.log" "$D/log/slurmctld.out" "$D/log/slurmd.out" 2>/dev/null
  "$0" stop "$D"
  skip "the private Slurm did not bring its node up here (node state '${state:-none}', logs above)"
fi
echo "SLURM_CONF=$SLURM_CONF"
