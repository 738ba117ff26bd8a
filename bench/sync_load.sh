#!/bin/bash
# The synchronizer at real model and fleet sizes: a real dloco-sync (its own
# temporary store, a loopback port, events to a file) against a load generator,
# one case at a time. Two sections:
#
# cpu (the default): what the synchronizer's CPU costs per merged byte. dloco-sync
# is pinned alone to one core (taskset, OMP_NUM_THREADS=1) and bench/loadgen (N
# learners in one thread: the real protocol over real sockets, pushes encoded
# once and sent zero-copy, Updates received and dropped unread) to the other;
# durability periodic, evaluation off. Cases:
#   gpt2_16_{fp32,int4}_{bcast,contrib}  GPT-2 124M (P=24), 16 learners
#             back-to-back (every learner pushes the fragments in the same
#             cyclic order, as the schedule does, each as soon as its previous
#             push is decided, 8 undecided per learner: 128 pushes against a
#             pool of 48 GPT-2 fragments; 24 each makes pushes wait past
#             loadgen's hold timeout, 2 leaves the synchronizer idle between
#             rounds), all learners starting once every one holds the model,
#             pushes in fp32 or int4
#             (--push_codec), every merged version sent to every learner
#             (--broadcast true, the default) or only to the round's
#             contributors (--broadcast false)
#   small_1024_sched  the quickstart model (L=4 C=128 NH=4 T=128 V=256, P=4,
#             H=24), 1,024 learners on the real push schedule at 1 step/s
#             (the synchronizer's Hello rate limit raised so they join at once)
# Per case, over a window after every learner holds the model and a warm-up:
# merged MB/s (fp32 bytes of the fragments whose pushes were ACCEPTED), the
# synchronizer's CPU seconds (/proc/PID/stat utime+stime, all its threads, and
# per thread) per merged GB next to memcpy's CPU seconds per GB on the same core
# (bench/memrate, pinned there, at the start and the end of the run: the best),
# their ratio (memcpys of CPU per merged byte), bytes the synchronizer sent per merged byte (its /metrics),
# pushes accepted / dropped / rejected by reason, and the load generator's own
# share of its core: a case's capacity figure (merged MB/s) is valid only while
# that share is below 60% (a warning line says when not; the CPU per merged
# byte is a cost and stays valid).
# Bar: sync_cpu_memcpys_per_merged_byte <= 3.3 (i.e. the synchronizer would
# merge >= 0.3 x memcpy's bytes/s with its core to itself), from the GPT-2 fp32
# case with broadcast (dloco-sync's defaults).
# The floor beside it (bench/floor, pinned to the synchronizer's core, its sender on the loadgen's): what
# any synchronizer that receives each pushed byte over TCP, checks its checksum and averages it into a
# round must spend at the least -- the kernel's receive copy, one read for the checksum, one for the
# mean, nothing else -- as `sync_floor_memcpys_per_merged_byte: X.X` (3.6-4.0 on the Intel machine of
# docs/RESULTS.md: above the bar; the bar line says so when it is).
# Last line: `sync_cpu_memcpys_per_merged_byte: X.X`.
#
# swarm (SYNC_LOAD_SWARM=1, before the cpu section): bench/swarm (N simulated
# learners, each a handle of the learner library's public API, fake training),
# not pinned:
#   schedule  GPT-2 124M (L=12 C=768 NH=12 T=1024 V=50257, P=24, H=24) with
#             4, 8 and 16 learners, and the quickstart model (L=4 C=128 NH=4
#             T=128 V=256, P=4, H=24) with 8, 32 and 128, each on the real
#             push schedule at 1 step/s, joining together; durability sync
#   capacity  GPT-2 124M, 16 learners back-to-back (a step every tick: each
#             fragment pushed again at the first step after its push is decided),
#             durability periodic: merged delta bytes/s (sum over merges of
#             contributors x fragment bytes), against one thread's memcpy and
#             merge arithmetic (bench/memrate) measured in the same run
# Per case, over the window after the warm-up: merges/s, contributors per
# merge, ack latency (swarm: Push handed to ZeroMQ -> its immediate Ack),
# merge latency (the synchronizer's push event -> the merge event of the
# version its ACCEPTED ack names), synchronizer CPU% (/proc/PID/stat) and max
# RSS (VmHWM), and over the whole run: rejections by reason, learners falsely
# declared dead (learner_dead before the learner's Bye: the swarm keeps every
# learner alive), failed merges (merge_failed), join time, data.mdb size at the
# start, after the warm-up and at the end.
# Bars (measured, PASS/FAIL/n/a): 0 false deaths, 0 rejections "base version
# newer than global", 0 failed merges, max RSS <= 2 x (model + momentum + pool
# bound) (n/a when dloco-sync states no pool bound), store size flat after the
# warm-up (+-10%).
# `sync_merge_vs_memcpy: X.XX` (merged delta bytes/s / memcpy bytes/s; no longer a
# bar) equals the synchronizer's CPU share times 1 / its memcpys per merged byte:
# it reached 0.3 only with the synchronizer's core saturated, and the swarm on the
# other core starves first, so it measured the swarm; the cpu section's
# sync_cpu_memcpys_per_merged_byte <= 3.3 is the same bar on the synchronizer alone.
# Bounded: every wait has a deadline, a process over its RSS limit is killed
# (the case then reports it), every process started is killed by PID at exit.
# Usage: bench/sync_load.sh   (env: SYNC_LOAD_QUICK=1 tiny cases, about a minute, for smoke;
#        CPU_DURATION=30 CPU_WARMUP=60 (GPT-2 cases' window, every cpu case's warm-up, s: the synchronizer's memory grows
#        to its steady size, page faults and all, for about a minute; a 5 s warm-up measured that growth,
#        up to twice the steady cost) CPU_WINDOW=8 SMALL_N=1024 SMALL_CPU_DURATION=30
#        SYNC_CORE=1 LOADGEN_CORE=0 SYNC_LOAD_SWARM=1 (also the swarm sections:
#        GPT2_DURATION=100 GPT2_WARMUP=40 SMALL_DURATION=60 SMALL_WARMUP=20 CAP_DURATION=90 CAP_WARMUP=40)
#        SYNC_RSS_LIMIT_MB=14000 SWARM_RSS_LIMIT_MB=6000 MIN_AVAIL_MB=1500 (a process is killed past these)
#        SYNC_LOAD_SYNC_ARGS="--chunk_kb 1024" extra dloco-sync options for every cpu case (a what-if; the bar is
#        the defaults'), SYNC_LOAD_CASES="gpt2_16_fp32_bcast ..." runs only the cpu cases named (the bar's case by default
#        is the first GPT-2 one; a run without it prints no bar figure)
#        BUILD_DIR=build KEEP_W=1 keeps the work dir)
set -uo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 0 "$@"
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
QUICK=${SYNC_LOAD_QUICK:-0}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
SWARM_ON=${SYNC_LOAD_SWARM:-0}
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-sync loadgen memrate floor $([ "$SWARM_ON" = 1 ] && echo swarm) >/dev/null || exit 1
SYNC=$BUILD_DIR/synchronizer/dloco-sync SWARM=$BUILD_DIR/bench/swarm MEMRATE=$BUILD_DIR/bench/memrate LOADGEN=$BUILD_DIR/bench/loadgen
FLOOR=$BUILD_DIR/bench/floor
SYNC_RSS_LIMIT_MB=${SYNC_RSS_LIMIT_MB:-14000} SWARM_RSS_LIMIT_MB=${SWARM_RSS_LIMIT_MB:-6000} MIN_AVAIL_MB=${MIN_AVAIL_MB:-1500}
W=$(mktemp -d /tmp/dloco_sync_load.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  [ -n "${KEEP_W:-}" ] && echo "work dir kept: $W" || rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cat > "$W/analyze.py" <<'PY'
# sync_load.sh's analysis: one case's row from its files (events, samples, the swarm's JSON), or, with
# --report, the table, the totals and the bars over every row.
import json, math, re, sys
from collections import Counter, defaultdict

LF = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')
ESC = {'n': '\n', 'r': '\r', 't': '\t', '"': '"', '\\': '\\'}


def unquote(v):
    if not v.startswith('"'):
        return v
    v, out, i = v[1:-1], [], 0
    while i < len(v):
        c = v[i]
        if c == '\\' and i + 1 < len(v):
            n = v[i + 1]
            if n == 'x' and i + 3 < len(v):
                out.append(chr(int(v[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append(ESC.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return ''.join(out)


def events(path):
    out = []
    try:
        f = open(path, errors='replace')
    except OSError:
        return out
    with f:
        for line in f:
            kv = {k: unquote(v) for k, v in LF.findall(line)}
            if 'event' in kv and 'ts' in kv:
                kv['ts'] = int(kv['ts'])
                out.append(kv)
    return out


def pct(v, q):
    if not v:
        return None
    v = sorted(v)
    return v[max(0, math.ceil(q * len(v)) - 1)]


def pool_bound(sync_ev, help_path):
    """Bytes of the pooled-push bound dloco-sync states, or None: a sync_start field naming a pool in
    bytes, else an option *pool*_mb with a non-zero default in --help."""
    for e in sync_ev:
        if e['event'] == 'sync_start':
            for k, v in e.items():
                if 'pool' in k and 'bytes' in k and v.isdigit() and int(v) > 0:
                    return int(v)
    try:
        for line in open(help_path):
            m = re.match(r'\s*--(\w*pool\w*_mb)\s.*\(default (\d+)\)', line)
            if m and int(m.group(2)) > 0:
                return int(m.group(2)) << 20
    except OSError:
        pass
    return None


def case(argv):
    name, d, mode, N, s_start, s_warm, s_end, clk, help_path, note, elapsed = argv
    N, clk = int(N), float(clk)
    row = {'name': name, 'mode': mode, 'learners': N, 'note': note.strip(), 'elapsed_s': int(elapsed),
           'store_start': int(s_start), 'store_warm': int(s_warm), 'store_end': int(s_end)}
    try:
        sw = json.load(open(d + '/swarm.json'))
    except (OSError, ValueError):
        row['error'] = 'no swarm summary' + (' (' + row['note'] + ')' if row['note'] else '')
        return row
    sev, wev = events(d + '/ev-sync.log'), events(d + '/ev-swarm.log')
    ws = sw['t0_wall_ns'] + int(sw['warmup_s'] * 1e9)
    we = sw['t0_wall_ns'] + int(sw['wall_s'] * 1e9)
    win = max(1e-9, (we - ws) / 1e9)
    fb = sw['fragment_bytes']
    row.update(window_s=win, joined=sw['joined'], join_p50=sw['join_s']['p50'], join_max=sw['join_s']['max'],
               ack_p50=sw['ack_ms']['p50'], ack_p99=sw['ack_ms']['p99'], ack_n=sw['ack_ms']['n'],
               decision_p50=sw['decision_ms']['p50'], decision_p99=sw['decision_ms']['p99'],
               swarm_pushes=sw['pushes'], swarm_rejected=sw['decisions']['rejected'],
               swarm_rehellos=sw['rehellos'], swarm_rebuilds=sw['rebuilds'],
               swarm_mb_per_learner=sw['memory_mb']['per_learner'], swarm_anon_max_mb=sw['memory_mb']['rss_anon_max'],
               model_bytes=sw['model']['params'] * 4)
    merges = [e for e in sev if e['event'] == 'merge' and ws <= e['ts'] <= we]
    row['merges'] = len(merges)
    row['merges_per_s'] = len(merges) / win
    row['contrib_per_merge'] = sum(int(e['n']) for e in merges) / len(merges) if merges else None
    row['merged_bytes_per_s'] = sum(int(e['n']) * fb[int(e['frag'])] for e in merges) / win
    # merge latency: the synchronizer's push event (arrival, decided pooled) -> the merge event of the
    # version its learner's ACCEPTED ack names
    pushed = defaultdict(list)
    for e in sev:
        if e['event'] == 'push' and e.get('decision', '').startswith('pooled'):
            pushed[(e['id'], e['frag'], e['base'])].append(e['ts'])
    merged_at = {(e['frag'], e['version']): e['ts'] for e in sev if e['event'] == 'merge'}
    lat = []
    for e in wev:
        if e['event'] != 'ack' or e.get('decision') != 'accepted':
            continue
        mts = merged_at.get((e['fragment'], e['merged_version']))
        ps = [t for t in pushed.get((e['learner'], e['fragment'], e['base_version']), []) if mts and t <= mts]
        if ps and ws <= ps[-1] <= we:
            lat.append((mts - ps[-1]) / 1e6)
    row['merge_lat_n'], row['merge_p50'], row['merge_p99'] = len(lat), pct(lat, 0.5), pct(lat, 0.99)
    rej = Counter(e.get('reason', '') for e in sev if e['event'] == 'push' and e.get('decision') == 'rejected')
    row['rejections'] = dict(rej)
    byes = {}
    for e in sev:
        if e['event'] == 'learner_bye':
            byes.setdefault(e['id'], e['ts'])
    ids = {p['id'] for p in sw['per_learner']}
    row['false_deaths'] = sum(1 for e in sev if e['event'] == 'learner_dead' and e['id'] in ids
                              and e['ts'] < byes.get(e['id'], 1 << 62))
    row['failed_merges'] = sum(1 for e in sev if e['event'] == 'merge_failed')
    row['pool_bound'] = pool_bound(sev, help_path)
    def samples(path):
        out = []
        try:
            for line in open(path):
                f = line.split()
                if len(f) == 5:
                    out.append((float(f[0]), int(f[1]), int(f[2]), int(f[3]), int(f[4])))
        except (OSError, ValueError):
            pass
        return out

    def cpu_pct(smp):
        inw = [s for s in smp if ws / 1e9 <= s[0] <= we / 1e9]
        return (100.0 * (inw[-1][1] - inw[0][1]) / clk / (inw[-1][0] - inw[0][0])
                if len(inw) >= 2 and inw[-1][0] > inw[0][0] else None)
    smp = samples(d + '/sync-samples')
    row['sync_cpu_pct'] = cpu_pct(smp)
    row['sync_max_rss_mb'] = max((s[3] for s in smp), default=0) / 1024.0 or None
    # the anonymous part (heap, pool, libzmq): VmHWM also counts the store's map pages the process has read
    # (page cache the kernel may drop), up to the whole data.mdb
    row['sync_anon_max_mb'] = max((s[4] for s in smp), default=0) / 1024.0 or None
    row['swarm_cpu_pct'] = cpu_pct(samples(d + '/swarm-samples'))
    return row


def fmt(v, spec='.0f', none='-'):
    return none if v is None else format(v, spec)


def report(rows_path, cap, memrate_path):
    rows = [json.loads(l) for l in open(rows_path) if l.strip()]
    print('%-16s %4s %8s %7s %15s %17s %5s %8s %5s %4s %4s %13s %24s %8s %6s' % (
        'case', 'N', 'merges/s', 'contrib', 'ack p50/p99 ms', 'merge p50/p99 ms', 'cpu%', 'maxRSS', 'rej',
        'dead', 'fail', 'join p50/max', 'store MB start/warm/end', 'swarm MB', 'sw cpu'))
    for r in rows:
        if 'error' in r:
            print('%-16s %4s error: %s' % (r['name'], r.get('learners', '?'), r['error']))
            continue
        mb = lambda b: b / 1e6
        print('%-16s %4d %8.2f %7s %15s %17s %5s %8s %5d %4d %4d %13s %24s %8s %6s' % (
            r['name'], r['learners'], r['merges_per_s'], fmt(r['contrib_per_merge'], '.2f'),
            fmt(r['ack_p50'], '.0f') + '/' + fmt(r['ack_p99'], '.0f'),
            fmt(r['merge_p50'], '.0f') + '/' + fmt(r['merge_p99'], '.0f'), fmt(r['sync_cpu_pct']),
            fmt(r['sync_max_rss_mb']), sum(r['rejections'].values()), r['false_deaths'], r['failed_merges'],
            fmt(r['join_p50'], '.1f') + '/' + fmt(r['join_max'], '.1f') + ' s' +
            ('' if r['joined'] == r['learners'] else ' (%d joined)' % r['joined']),
            '%.0f/%.0f/%.0f' % (mb(r['store_start']), mb(r['store_warm']), mb(r['store_end'])),
            fmt(r['swarm_mb_per_learner'], '.1f'), fmt(r.get('swarm_cpu_pct'))))
        for why, n in sorted(r['rejections'].items()):
            print('%-16s      rejected %d: %s' % ('', n, why))
        if r['note']:
            print('%-16s      note: %s' % ('', r['note']))
    ok = [r for r in rows if 'error' not in r]
    deaths = sum(r['false_deaths'] for r in ok)
    failed = sum(r['failed_merges'] for r in ok)
    newer = sum(r['rejections'].get('base version newer than global', 0) for r in ok)
    print('columns: ack = swarm push -> its immediate Ack; merge = sync push event -> merge event of its round '
          '(both over the window after the warm-up); cpu% = dloco-sync, sw cpu = the swarm (same window, 100 = one '
          'core); maxRSS = dloco-sync VmHWM, MiB; swarm MB = the swarm\'s private pages per learner')
    print('false_deaths: %d' % deaths)
    print('failed_merges: %d' % failed)
    mem = {}
    try:
        for line in open(memrate_path):
            k, v = line.split()[:2]
            mem[k] = float(v)
    except (OSError, ValueError):
        pass
    capr = next((r for r in ok if r['name'] == cap), None)
    merged = capr['merged_bytes_per_s'] if capr else 0.0
    copy = mem.get('memcpy_bytes_per_s')
    ratio = merged / copy if copy else 0.0
    print('capacity (%s): merged delta bytes/s %.3g (%d merges, %s contributors/merge over %.0f s); one thread: '
          'memcpy %.3g B/s, merge arithmetic (weighted mean of %d + Nesterov) %.3g B/s; sync merged / merge loop %.2f'
          % (cap, merged, capr['merges'] if capr else 0, fmt(capr and capr['contrib_per_merge'], '.2f'),
             capr['window_s'] if capr else 0, copy or 0, int(mem.get('M', 0)), mem.get('merge_bytes_per_s', 0),
             merged / mem['merge_bytes_per_s'] if mem.get('merge_bytes_per_s') else 0))
    verdict = lambda c: 'PASS' if c else 'FAIL'
    s2 = next((r for r in ok if r['name'] == cap + '_s2'), None)
    shard_ratio = s2['merged_bytes_per_s'] / merged if s2 and merged else None
    print('bar: every case completed: %s (%d of %d)' % (verdict(len(ok) == len(rows)), len(ok), len(rows)))
    print('bar: 0 false deaths: %s (%d)' % (verdict(deaths == 0), deaths))
    print('bar: 0 rejections "base version newer than global": %s (%d)' % (verdict(newer == 0), newer))
    print('bar: 0 failed merges: %s (%d)' % (verdict(failed == 0), failed))
    rss = []
    for r in ok:
        if r['sync_max_rss_mb'] is None:
            continue
        base = 2 * r['model_bytes'] / 2**20
        if r['pool_bound'] is None:
            rss.append('%s n/a (%.0f MiB = %.1f x model+momentum; no pool bound)' % (r['name'], r['sync_max_rss_mb'],
                                                                                   r['sync_max_rss_mb'] / base))
        else:
            lim = 2 * (base + r['pool_bound'] / 2**20)
            rss.append('%s %s (%.0f of %.0f MiB; anonymous %s)' % (r['name'], verdict(r['sync_max_rss_mb'] <= lim),
                                                                  r['sync_max_rss_mb'], lim,
                                                                  fmt(r.get('sync_anon_max_mb'))))
    all_na = all(r['pool_bound'] is None for r in ok)
    rss_fail = any(' FAIL ' in s for s in rss)
    print('bar: max RSS <= 2 x (model + momentum + pool bound): %s: %s' % (
        'n/a (dloco-sync states no pool bound)' if all_na else verdict(not rss_fail), '; '.join(rss)))
    flat = []
    for r in ok:
        if r['store_warm'] > 0:
            dev = (r['store_end'] - r['store_warm']) / r['store_warm']
            flat.append((abs(dev) <= 0.10, '%s %+.0f%%' % (r['name'], 100 * dev)))
    print('bar: store size flat after the warm-up (+-10%%): %s: %s' % (
        verdict(flat and all(f[0] for f in flat)), ', '.join(f[1] for f in flat)))
    print('bar: 2 shards merge >= 1.7 x the bytes of one: %s' % (
        'n/a (no sharded case)' if shard_ratio is None else '%s (%.2f x: %.3g vs %.3g B/s)' % (
            verdict(shard_ratio >= 1.7), shard_ratio, s2['merged_bytes_per_s'], merged)))
    # not a bar: the swarm on the other core is the limit (see the cpu section's figure)
    print('sync_merge_vs_memcpy: %.2f (the swarm\'s limit, not the synchronizer\'s: the bar is the cpu section\'s)' % ratio)


if __name__ == '__main__':
    if sys.argv[1] == '--report':
        report(*sys.argv[2:5])
    else:
        print(json.dumps(case(sys.argv[1:12])))
PY
GPT2="--n_layer 12 --n_head 12 --n_embd 768 --seq_len 1024 --vocab 50257"
SMALL="--n_layer 4 --n_head 4 --n_embd 128 --seq_len 128 --vocab 256"
CLK_TCK=$(getconf CLK_TCK)
"$SYNC" --help > "$W/sync-help.txt" 2>&1

alive() { kill -0 "$1" 2>/dev/null; }
fsize() { stat -c %s "$1" 2>/dev/null || echo 0; }
# wait_gone SECONDS PID: 0 once PID exited (reaped), 1 at the deadline
wait_gone() {
  local deadline=$(( $(date +%s) + $1 ))
  while alive "$2"; do [ "$(date +%s)" -lt "$deadline" ] || return 1; sleep 0.2; done
  wait "$2" 2>/dev/null
  return 0
}
# sample PID LIMIT_MB FIELD OUT: every 0.5 s "wall_s cpu_ticks VmRSS_kB VmHWM_kB RssAnon_kB" until PID
# exits; kills PID (and says so in OUT.killed) when FIELD (VmRSS or RssAnon) passes LIMIT_MB
sample() {
  local pid=$1 limit_kb=$(( $2 * 1024 )) field=$3 out=$4 st k v rss hwm anon
  while alive "$pid"; do
    read -r -a st < "/proc/$pid/stat" 2>/dev/null || break
    rss=0 hwm=0 anon=0
    while read -r k v _; do
      case $k in VmRSS:) rss=$v ;; VmHWM:) hwm=$v ;; RssAnon:) anon=$v ;; esac
    done < "/proc/$pid/status" 2>/dev/null
    echo "$(date +%s.%N) $(( st[13] + st[14] )) $rss $hwm $anon" >> "$out"
    if { [ "$field" = VmRSS ] && [ "$rss" -gt "$limit_kb" ]; } || { [ "$field" = RssAnon ] && [ "$anon" -gt "$limit_kb" ]; }; then
      echo "$field over ${2} MiB" > "$out.killed"
      kill -KILL "$pid" 2>/dev/null
      break
    fi
    read -r _ avail _ < <(grep '^MemAvailable:' /proc/meminfo)
    if [ "${avail:-0}" -lt $(( MIN_AVAIL_MB * 1024 )) ]; then # the machine is shared: never push it into the OOM killer
      echo "MemAvailable under $MIN_AVAIL_MB MiB" > "$out.killed"
      kill -KILL "$pid" 2>/dev/null
      break
    fi
    sleep 0.5
  done
}

# run_case NAME "MODEL" P H N MODE RATE DURATION WARMUP DURABILITY: one case; appends its row to $W/rows.jsonl.
# SHARDS=S (default 1): S dloco-sync shards (--shards S --shard k, a store each), the swarm's learners hold one
# session per shard; the row then covers them all (events, store sizes summed; CPU and RSS of shard 0)
run_case() {
  local name=$1 model=$2 P=$3 H=$4 N=$5 mode=$6 rate=$7 dur=$8 warm=$9 durab=${10}
  local S=${SHARDS:-1} d="$W/$name" eps="" ep wp smp wsmp t0 k
  local -a sps=()
  mkdir -p "$d"
  echo "case $name: $N learners, $mode, P=$P H=$H, $rate step/s, ${dur} s (warm-up ${warm} s), durability $durab$([ "$S" -gt 1 ] && echo ", $S shards")" >&2
  t0=$(date +%s)
  for k in $(seq 0 $((S - 1))); do
    local shard_args=""
    [ "$S" -gt 1 ] && shard_args="--shards $S --shard $k"
    "$SYNC" --store "$d/store$k" --bind tcp://127.0.0.1:0 $model --fragments "$P" --H "$H" --durability "$durab" \
      --status_every_ms 0 $shard_args --events "$d/ev-sync$k.log" > "$d/sync$k.log" 2>&1 &
    sps+=("$!"); PIDS+=("$!")
  done
  sample "${sps[0]}" "$SYNC_RSS_LIMIT_MB" VmRSS "$d/sync-samples" &
  smp=$!; PIDS+=("$smp")
  for k in $(seq 0 $((S - 1))); do
    ep=""
    for _ in $(seq 1 900); do # a GPT-2 store is created and initialised first
      ep=$(sed -n 's/.* event=sync_start .*endpoint=\([^ ]*\).*/\1/p' "$d/ev-sync$k.log" 2>/dev/null | tail -n 1)
      [ -n "$ep" ] && break
      alive "${sps[$k]}" || break
      sleep 0.2
    done
    if [ -z "$ep" ]; then
      echo "case $name: dloco-sync $k did not start: $(tail -n 3 "$d/sync$k.log" | tr '\n' ' ')" >&2
      kill -KILL "${sps[@]}" 2>/dev/null; for sp in "${sps[@]}"; do wait_gone 10 "$sp"; done
      echo "{\"name\":\"$name\",\"error\":\"dloco-sync did not start\"}" >> "$W/rows.jsonl"
      return
    fi
    eps="${eps:+$eps,}$ep"
  done
  stores() { local t=0; for k in $(seq 0 $((S - 1))); do t=$(( t + $(fsize "$d/store$k/data.mdb") )); done; echo $t; }
  local store_start store_warm store_end
  store_start=$(stores)
  "$SWARM" --endpoint "$eps" $model --fragments "$P" --learners "$N" --mode "$mode" --rate "$rate" \
    --duration "$dur" --warmup "$warm" --json "$d/swarm.json" --events "$d/ev-swarm.log" > "$d/swarm.log" 2>&1 &
  wp=$!; PIDS+=("$wp")
  sample "$wp" "$SWARM_RSS_LIMIT_MB" RssAnon "$d/swarm-samples" &
  wsmp=$!; PIDS+=("$wsmp")
  local tw=$(( $(date +%s) + ${warm%.*} ))
  while [ "$(date +%s)" -lt "$tw" ] && alive "$wp"; do sleep 0.2; done
  store_warm=$(stores)
  local note=""
  if ! wait_gone $(( ${dur%.*} + 180 )) "$wp"; then
    note="swarm did not finish in time (killed)"
    kill -KILL "$wp" 2>/dev/null; wait_gone 10 "$wp"
  fi
  store_end=$(stores)
  for k in $(seq 0 $((S - 1))); do
    alive "${sps[$k]}" || note="$note dloco-sync $k died during the case"
    kill -TERM "${sps[$k]}" 2>/dev/null
  done
  for k in $(seq 0 $((S - 1))); do
    if ! wait_gone 120 "${sps[$k]}"; then note="$note dloco-sync $k did not stop on SIGTERM (killed)"; kill -KILL "${sps[$k]}" 2>/dev/null; wait_gone 10 "${sps[$k]}"; fi
  done
  kill -KILL "$smp" "$wsmp" 2>/dev/null; wait_gone 5 "$smp"; wait_gone 5 "$wsmp"
  [ -f "$d/sync-samples.killed" ] && note="$note dloco-sync killed: $(cat "$d/sync-samples.killed")"
  [ -f "$d/swarm-samples.killed" ] && note="$note swarm killed: $(cat "$d/swarm-samples.killed")"
  cat "$d"/ev-sync[0-9]*.log > "$d/ev-sync.log" # the shards' fragments are disjoint: their events together
  python3 "$W/analyze.py" "$name" "$d" "$mode" "$N" "$store_start" "$store_warm" "$store_end" "$CLK_TCK" \
    "$W/sync-help.txt" "$note" "$(( $(date +%s) - t0 ))" >> "$W/rows.jsonl" ||
    echo "{\"name\":\"$name\",\"error\":\"analysis failed\"}" >> "$W/rows.jsonl"
  [ -n "${KEEP_W:-}" ] || rm -rf "$d"/store[0-9]* # a GPT-2 store is GBs: one at a time on disk
}

if [ "$SWARM_ON" != 1 ]; then
  :
elif [ "$QUICK" = 1 ]; then
  echo "sync_load (quick: tiny cases for smoke, not the figures)"
  run_case sched_small_4 "$SMALL" 4 24 4 schedule 4 12 4 sync
  run_case sched_small_8 "$SMALL" 4 24 8 schedule 4 12 4 sync
  run_case cap_small_4_b2b "$SMALL" 4 24 4 b2b 4 10 3 periodic
  SHARDS=2 run_case cap_small_4_b2b_s2 "$SMALL" 4 24 4 b2b 4 10 3 periodic
  CAP=cap_small_4_b2b MEMRATE_ARGS="1048576 4 0.3"
else
  GD=${GPT2_DURATION:-100} GW=${GPT2_WARMUP:-40} SD=${SMALL_DURATION:-60} SW=${SMALL_WARMUP:-20}
  CD=${CAP_DURATION:-90} CW=${CAP_WARMUP:-40}
  for n in 4 8 16; do run_case "sched_gpt2_$n" "$GPT2" 24 24 "$n" schedule 1 "$GD" "$GW" sync; done
  for n in 8 32 128; do run_case "sched_small_$n" "$SMALL" 4 24 "$n" schedule 1 "$SD" "$SW" sync; done
  run_case cap_gpt2_16_b2b "$GPT2" 24 24 16 b2b 1 "$CD" "$CW" periodic
  SHARDS=2 run_case cap_gpt2_16_b2b_s2 "$GPT2" 24 24 16 b2b 1 "$CD" "$CW" periodic
  CAP=cap_gpt2_16_b2b MEMRATE_ARGS="5186496 16 1" # GPT-2 124M's mean fragment (124475904 / 24 floats), 16 deltas
fi
if [ "$SWARM_ON" = 1 ]; then
  "$MEMRATE" $MEMRATE_ARGS > "$W/memrate.txt" 2>&1 || echo "memrate failed: $(cat "$W/memrate.txt")" >&2
  python3 "$W/analyze.py" --report "$W/rows.jsonl" "$CAP" "$W/memrate.txt"
fi

# ---- cpu: the synchronizer pinned alone to one core, bench/loadgen to the other
NCPU=$(nproc)
SYNC_CORE=${SYNC_CORE:-1} LOADGEN_CORE=${LOADGEN_CORE:-0}
if [ "$NCPU" -lt 2 ]; then
  echo "warning: $NCPU core: dloco-sync and loadgen share it (the figures are not per core)" >&2
  SYNC_CORE=0 LOADGEN_CORE=0
fi
cat > "$W/cpu.py" <<'PY'
# sync_load.sh's cpu section: the table, the warnings and the bar from loadgen's JSON rows.
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
mem = [float(x) for x in sys.argv[2].split(',') if x]
copy = max(mem) if mem else 0.0
head = sys.argv[3]
print('memcpy on the synchronizer\'s core: %s GB per CPU second (best of %d runs: %s) = %.3f CPU s per GB' % (
    '%.2f' % (copy / 1e9) if copy else '?', len(mem), ', '.join('%.2f' % (m / 1e9) for m in mem),
    1e9 / copy if copy else float('nan')))
print('%-26s %5s %5s %7s %6s %12s %5s %5s %9s %9s %8s %6s %7s %s' % (
    'case', 'N', 'codec', 'bcast', 'win s', 'merged', 'sync%', 'lg%', 'sync s/GB', 'memcpys/B', 'out/in B',
    'stalls', 'pushes', 'accepted/dropped/rejected(busy)'))
fig = {}
warn = []
for r in rows:
    if 'error' in r:
        print('%-26s error: %s' % (r['name'], r['error']))
        continue
    w = r['window']
    spg = r['sync_cpu_s_per_merged_gb']
    x = spg * copy / 1e9 if spg > 0 and copy else None
    fig[r['name']] = x
    print('%-26s %5d %5s %7s %6.1f %7.1f MB/s %5.0f %5.0f %9s %9s %8s %6d %7d %d/%d/%d(%d)' % (
        r['name'], r['learners'], r['push_codec'], r['bcast'], r['window_s'], r['merged_mb_per_s'],
        100 * r['sync_cpu_share'], 100 * r['loadgen_cpu_share'], '%.2f' % spg if spg > 0 else '-',
        '%.1f' % x if x is not None else '-',
        '%.3f' % r['bytes_out_per_merged_byte'] if r['bytes_out_per_merged_byte'] >= 0 else '-',
        r.get('sync_stalls', 0), w['pushes'], w['accepted'], w['dropped_stale'], w['rejected'], w['busy']))
    thr = sorted(r['sync_threads_cpu_s'].items(), key=lambda kv: -kv[1])
    print('%-26s      sync threads (CPU s over the window): %s' % ('', ', '.join('%s %.2f' % kv for kv in thr[:6])))
    # the split: libzmq's I/O threads (the kernel's socket copies, mostly) and the rest (loop, worker);
    # contributions per merge: a round's fixed work (outer step, store write, Update) spreads over them
    gb = w['merged_bytes'] / 1e9
    if x is not None and gb > 0 and copy:
        io = sum(v for k, v in r['sync_threads_cpu_s'].items() if k.startswith('ZMQbg'))
        rest = sum(r['sync_threads_cpu_s'].values()) - io
        nm = r.get('sync_merges', 0)
        print('%-26s      memcpys per merged byte: libzmq I/O %.1f, loop + worker %.1f; merges %d, %.1f contributions '
              'each' % ('', io / gb * copy / 1e9, rest / gb * copy / 1e9, nm,
                        r.get('sync_merged_contributions', 0) / nm if nm else float('nan')))
    for why, n in sorted(w['rejected_by_reason'].items(), key=lambda kv: -kv[1]):
        print('%-26s      rejected %d: %s' % ('', n, why))
    if r['joined'] != r['learners'] or r['ready'] != r['learners']:
        warn.append('warning: %s: %d of %d learners joined, %d held the model' % (
            r['name'], r['joined'], r['learners'], r['ready']))
    if r['loadgen_cpu_share'] >= 0.6:
        warn.append('warning: %s: loadgen used %.0f%% of its core (>= 60%%): its merged MB/s is the load '
                    'generator\'s limit, not the synchronizer\'s capacity' % (r['name'], 100 * r['loadgen_cpu_share']))
    if not r['window_complete']:
        warn.append('warning: %s: the window was cut short' % r['name'])
    if r['last_error']:
        print('%-26s      last error: %s' % ('', r['last_error']))
for line in warn:
    print(line)
print('columns: merged = fp32 bytes of the fragments whose pushes were ACCEPTED in the window, per second; sync% / '
      'lg% = dloco-sync / loadgen CPU over the window (100 = one core); sync s/GB = dloco-sync CPU seconds per merged '
      'GB; memcpys/B = that over memcpy\'s CPU seconds per GB on the same core; out/in B = bytes dloco-sync sent (its '
      '/metrics) per merged byte; stalls = dloco-sync\'s sync_stall events (its loop did not run for a heartbeat '
      'period: on a shared machine, mostly other processes on its core)')
h = fig.get(head)
x = rows and next((r for r in rows if r.get('name') == head), None)
if x and 'error' not in x and copy:
    print('sync_merge_vs_memcpy (%s, the old figure: merged B/s / memcpy B/s = sync share / memcpys per byte): %.3f' % (
        head, x['merged_mb_per_s'] * 1e6 / copy))
fl = {}
for line in open(sys.argv[4]) if len(sys.argv) > 4 else []:
    k, _, v = line.partition(' ')
    try:
        fl[k] = float(v)
    except ValueError:
        pass
floor = fl.get('floor_memcpys_per_merged_byte')
if floor is not None:
    # the floor's memcpys are its own memcpy's (the same core, measured in its process)
    print('floor of the design on this core (bench/floor, %d deltas of %d floats): the kernel\'s receive copy %.2f + '
          'one checksum read %.2f + one read by the mean %.2f = %.2f memcpys per merged byte, with nothing else; '
          'the synchronizer spends %s, %s above it' % (
              fl.get('M', 0), fl.get('fragment_floats', 0), fl['recv_memcpys_per_byte'],
              fl['checksum_memcpys_per_byte'], fl['mean_memcpys_per_byte'], floor,
              '?' if h is None else '%.1f' % h, '?' if h is None else '%.1f' % (h - floor)))
    print('sync_floor_memcpys_per_merged_byte: %.1f' % floor)
print('bar: sync_cpu_memcpys_per_merged_byte <= 3.3 (%s): %s%s' % (
    head, 'n/a (no figure)' if h is None else ('PASS' if h <= 3.3 else 'FAIL') + ' (%.1f)' % h,
    '' if floor is None or floor <= 3.3 else '; the bar is below the floor (%.1f)' % floor))
print('sync_cpu_memcpys_per_merged_byte: %s' % ('nan' if h is None else '%.1f' % h))
PY

# memrate_core: memcpy's bytes per CPU second on the synchronizer's core (CPU time, as the synchronizer's
# is counted: wall time would count what the machine's other processes took from that core)
memrate_core() {
  taskset -c "$SYNC_CORE" env OMP_NUM_THREADS=1 "$MEMRATE" 5186496 1 0.5 2>/dev/null | sed -n 's/^memcpy_cpu_bytes_per_s //p'
}

# cpu_case NAME STORE "MODEL" P N MODE CODEC BROADCAST DURATION WARMUP [dloco-sync args...]: one case;
# appends loadgen's JSON (with name and bcast) to $W/cpu.jsonl. CASE_RATE=R: schedule steps/s (default 1)
cpu_case() {
  local name=$1 store=$2 model=$3 P=$4 N=$5 mode=$6 codec=$7 bc=$8 dur=$9 warm=${10}
  shift 10
  if [ -n "${SYNC_LOAD_CASES:-}" ] && [[ " $SYNC_LOAD_CASES " != *" $name "* ]]; then return; fi
  local d="$W/$name" sp lp ep="" ma="" smp
  mkdir -p "$d"
  echo "case $name: $N learners, $mode, P=$P, push $codec, broadcast $bc, window ${dur} s after a ${warm} s warm-up" >&2
  OMP_NUM_THREADS=1 taskset -c "$SYNC_CORE" "$SYNC" --store "$store" --bind tcp://127.0.0.1:0 $model --fragments "$P" \
    --durability periodic --status_every_ms 0 --eval_every_s 0 --broadcast "$bc" --metrics 127.0.0.1:0 \
    --events "$d/ev-sync.log" "$@" ${SYNC_LOAD_SYNC_ARGS:-} > "$d/sync.log" 2>&1 &
  sp=$!; PIDS+=("$sp")
  sample "$sp" "$SYNC_RSS_LIMIT_MB" VmRSS "$d/sync-samples" &
  smp=$!; PIDS+=("$smp")
  for _ in $(seq 1 900); do # a new GPT-2 store is created and initialised first
    ep=$(sed -n 's/.* event=sync_start .*endpoint=\([^ ]*\).*/\1/p' "$d/ev-sync.log" 2>/dev/null | tail -n 1)
    ma=$(sed -n 's/.* event=metrics_listen .*addr=\([^ ]*\).*/\1/p' "$d/ev-sync.log" 2>/dev/null | tail -n 1)
    [ -n "$ep" ] && [ -n "$ma" ] && break
    alive "$sp" || break
    sleep 0.2
  done
  if [ -z "$ep" ]; then
    echo "case $name: dloco-sync did not start: $(tail -n 3 "$d/sync.log" | tr '\n' ' ')" >&2
    kill -KILL "$sp" "$smp" 2>/dev/null; wait_gone 10 "$sp"; wait_gone 5 "$smp"
    echo "{\"name\":\"$name\",\"error\":\"dloco-sync did not start\"}" >> "$W/cpu.jsonl"
    return
  fi
  taskset -c "$LOADGEN_CORE" "$LOADGEN" --endpoint "$ep" $model --fragments "$P" --learners "$N" --mode "$mode" \
    --push_codec "$codec" --rate "${CASE_RATE:-1}" --window "${CPU_WINDOW:-8}" --duration "$dur" --warmup "$warm" --join_timeout 120 --sync_pid "$sp" --metrics "$ma" \
    --json "$d/lg.json" > "$d/lg.log" 2>&1 &
  lp=$!; PIDS+=("$lp")
  local note=""
  if ! wait_gone $(( ${dur%.*} + ${warm%.*} + 240 )) "$lp"; then
    note="loadgen did not finish in time (killed)"; kill -KILL "$lp" 2>/dev/null; wait_gone 10 "$lp"
  fi
  alive "$sp" || note="$note; dloco-sync died during the case"
  kill -TERM "$sp" 2>/dev/null
  if ! wait_gone 120 "$sp"; then note="$note; dloco-sync did not stop on SIGTERM (killed)"; kill -KILL "$sp" 2>/dev/null; wait_gone 10 "$sp"; fi
  wait_gone 5 "$smp" || kill -KILL "$smp" 2>/dev/null # it ends with dloco-sync
  [ -f "$d/sync-samples.killed" ] && note="$note; dloco-sync killed: $(cat "$d/sync-samples.killed")"
  if [ -s "$d/lg.json" ] && [ -z "$note" ]; then
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); r["name"] = sys.argv[2]; r["bcast"] = "on" if sys.argv[3] == "true" else "contrib"; r["sync_stalls"] = sum(" event=sync_stall " in l for l in open(sys.argv[4], errors="replace")); print(json.dumps(r))' \
      "$d/lg.json" "$name" "$bc" "$d/ev-sync.log" >> "$W/cpu.jsonl"
  else
    echo "{\"name\":\"$name\",\"error\":\"${note:-no loadgen summary}: $(tail -n 2 "$d/lg.log" | tr '\n"' ' _')\"}" >> "$W/cpu.jsonl"
  fi
}

echo "sync_load cpu: dloco-sync on core $SYNC_CORE, loadgen on core $LOADGEN_CORE ($(nproc) cores; other work on this machine shares them)"
MEMS=$(memrate_core)
# the design's floor on the synchronizer's core (bench/floor: the kernel's receive copy from a sender on the
# loadgen's core, one checksum read, one read by the mean; nothing else), at the GPT-2 case's sizes
if [ "$QUICK" = 1 ]; then FLOOR_ARGS="1048576 4 0.2"; else FLOOR_ARGS="5186496 16 0.5"; fi
taskset -c "$SYNC_CORE" env OMP_NUM_THREADS=1 "$FLOOR" $FLOOR_ARGS "$LOADGEN_CORE" > "$W/floor.txt" 2>&1 ||
  echo "floor failed: $(tail -n 2 "$W/floor.txt" | tr '\n' ' ')" >&2
: > "$W/cpu.jsonl"
HELLO_ARGS="--max_new_hellos_per_s 100000 --new_hello_burst 4096" # the admission limit is not what is measured
if [ "$QUICK" = 1 ]; then
  echo "sync_load cpu (quick: tiny cases for smoke, not the figures)"
  for codec in fp32 int4; do
    for bc in true false; do
      cpu_case "small_16_${codec}_$([ $bc = true ] && echo bcast || echo contrib)" "$W/store-small" "$SMALL" 4 16 b2b "$codec" "$bc" 4 1
    done
  done
  CASE_RATE=8 cpu_case small_64_sched "$W/store-small" "$SMALL" 4 "${SMALL_N:-64}" schedule fp32 true 4 1 $HELLO_ARGS
  HEAD=small_16_fp32_bcast
else
  CD=${CPU_DURATION:-30} CW=${CPU_WARMUP:-60}
  for codec in fp32 int4; do
    for bc in true false; do # one store for the four: a GPT-2 store takes half a minute to create
      cpu_case "gpt2_16_${codec}_$([ $bc = true ] && echo bcast || echo contrib)" "$W/store-gpt2" "$GPT2" 24 16 b2b "$codec" "$bc" "$CD" "$CW"
    done
  done
  cpu_case "small_${SMALL_N:-1024}_sched" "$W/store-small" "$SMALL" 4 "${SMALL_N:-1024}" schedule fp32 true \
    "${SMALL_CPU_DURATION:-30}" "$CW" --max_learners "${SMALL_N:-1024}" $HELLO_ARGS
  HEAD=gpt2_16_fp32_bcast
fi
MEMS="$MEMS,$(memrate_core)"
python3 "$W/cpu.py" "$W/cpu.jsonl" "$MEMS" "$HEAD" "$W/floor.txt"
