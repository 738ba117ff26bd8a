"""The Python tests' cluster helpers (tests/test_py_*.py), the equivalent of
tests/lib_cluster.sh and tests/lib_events.sh: start dloco-sync, dloco-learner
and Python learners as real processes on loopback, wait on their event logs
(docs/EVENTS.md) with deadlines, and kill by PID every process a test started,
nothing else. Assertions read event logs and JSON, never human log lines.

A test builds one Cluster:
    c = Cluster("interop")            # a fresh work dir, processes killed at exit
    ep = c.start_sync("sync", "--H", "8")
    c.start_learner("l0", "--steps", "60")
    c.start_py("t0", "examples/torch/gpt2.py", "--connect", ep, ...)
    c.wait_pid("t0", 300)
    c.check("what is true", cond)     # prints ok:/FAIL:, the exit code is c.done()"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SRC = os.environ.get("DLOCO_SRC") or os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BIN = os.environ.get("DLOCO_BIN") or os.path.join(SRC, "build")
PY = os.environ.get("DLOCO_TORCH_PYTHON", "/usr/bin/python3")  # Debian's python3-torch lives here
SYNC = os.path.join(BIN, "synchronizer", "dloco-sync")
LEARNER = os.path.join(BIN, "learner", "dloco-learner")
DLOCO = os.path.join(BIN, "tools", "dloco")
MODEL = ["--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--seq_len", "32"]
OUTER = ["--outer_lr", "1.0", "--outer_momentum", "0"]  # local-SGD outer step, as lib_cluster.sh (short H)


def library():
    """The libdloco_learner.so of this build tree (DLOCO_LIBRARY wins)."""
    if os.environ.get("DLOCO_LIBRARY"):
        return os.environ["DLOCO_LIBRARY"]
    for pat in ("learner/libdloco_learner.so", "libdloco_learner.so", "*/libdloco_learner.so",
                "**/libdloco_learner.so"):
        hits = sorted(glob.glob(os.path.join(BIN, pat), recursive=True))
        if hits:
            return hits[0]
    return ""


def py_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(SRC, "python") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    lib = library()
    if lib:
        env["DLOCO_LIBRARY"] = lib
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# ---- logfmt events (docs/EVENTS.md)

_TOKEN = re.compile(r'([^ ="]+)=("(?:[^"\\]|\\.)*"|[^ ]*)')


def parse_line(line):
    kv = {}
    for k, v in _TOKEN.findall(line):
        if v.startswith('"'):
            v = re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1)), v[1:-1])
        kv[k] = v
    return kv


def events(path, name=None, **conds):
    """Events of `name` (all when None) in the file whose fields equal conds."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            kv = parse_line(line)
            if name is not None and kv.get("event") != name:
                continue
            if all(kv.get(k) == str(v) for k, v in conds.items()):
                out.append(kv)
    return out


class Failed(Exception):
    pass


class Cluster:
    def __init__(self, name):
        self.name = name
        self.w = tempfile.mkdtemp(prefix="dloco_py_%s." % name)
        self.procs = {}
        self.fails = 0
        self.env = py_env()

    # ---- processes

    def _spawn(self, name, argv, env=None):
        log = open(os.path.join(self.w, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env or self.env, cwd=SRC)
        self.procs[name] = p
        return p

    def ev(self, name):
        return os.path.join(self.w, "events-%s.log" % name)

    def start_sync(self, name, *args, store=None, model=True):
        """dloco-sync on an ephemeral loopback port; returns its endpoint."""
        open(self.ev(name), "w").close()
        argv = [SYNC, "--store", store or os.path.join(self.w, "store"), "--bind", "tcp://127.0.0.1:0",
                "--heartbeat_ms", "200", "--status_every_ms", "0", "--chunk_kb", "4", "--push_chunk_max_kb", "8",
                "--events", self.ev(name)]
        if model:
            argv += MODEL + ["--vocab", "256"]
        self._spawn(name, argv + list(args))
        deadline = time.time() + 30
        while time.time() < deadline:
            e = events(self.ev(name), "sync_start")
            if e:
                return e[-1]["endpoint"]
            if self.procs[name].poll() is not None:
                self.die("dloco-sync %s exited at start (rc %s)" % (name, self.procs[name].returncode))
            time.sleep(0.1)
        self.die("dloco-sync %s did not start" % name)

    def start_learner(self, name, ep, *args):
        open(self.ev(name), "w").close()
        argv = [LEARNER, "--connect", ep, "--id", name, "--device", "cpu"] + MODEL + [
            "--data", self.corpus(), "--batch", "8", "--warmup", "5", "--lr", "3e-3", "--threads", "1",
            "--log_every", "50", "--events", self.ev(name), "--loss_log", os.path.join(self.w, "loss-%s.txt" % name),
            "--state_dir", os.path.join(self.w, "state")]
        return self._spawn(name, argv + list(args))

    def start_py(self, name, script, *args):
        """A Python script (an example) with the package and library on its path."""
        return self._spawn(name, [PY, os.path.join(SRC, script)] + list(args))

    def wait_pid(self, name, seconds):
        try:
            return self.procs[name].wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.die("%s still running after %d s" % (name, seconds))

    def stop(self, name, sig=signal.SIGTERM, seconds=30):
        p = self.procs[name]
        if p.poll() is None:
            p.send_signal(sig)
        return self.wait_pid(name, seconds)

    def json_out(self, name):
        """The last line of a process's output that parses as a JSON object."""
        with open(os.path.join(self.w, name + ".log"), errors="replace") as f:
            for line in reversed(f.read().splitlines()):
                if line.startswith("{"):
                    try:
                        return json.loads(line)
                    except ValueError:
                        pass
        self.die("no JSON summary from %s" % name)

    def run(self, argv, **kw):
        """A command to completion; its stdout (check=True: a failure fails the test)."""
        r = subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd=SRC, timeout=kw.get("timeout", 300))
        if kw.get("check", True) and r.returncode != 0:
            self.die("%s failed (rc %d): %s" % (" ".join(argv[:3]), r.returncode, (r.stdout + r.stderr)[-2000:]))
        return r

    # ---- waits and checks

    def wait_event(self, seconds, path, name, **conds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if events(path, name, **conds):
                return True
            time.sleep(0.1)
        return False

    def wait_until(self, seconds, cond):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if cond():
                return True
            time.sleep(0.2)
        return False

    def corpus(self):
        path = os.path.join(self.w, "corpus.txt")
        if not os.path.exists(path):
            with open(path, "w") as f:
                for i in range(1, 3001):
                    f.write("line %d: the quick brown fox jumps over the lazy dog number %d.\n" % (i, i * 7919 % 1000))
        return path

    def check(self, what, ok):
        print(("ok: " if ok else "FAIL: ") + what, flush=True)
        if not ok:
            self.fails += 1
        return ok

    def die(self, msg):
        print("FAIL: " + msg, flush=True)
        for f in sorted(glob.glob(os.path.join(self.w, "*.log"))):
            if os.path.basename(f).startswith("events-"):
                continue
            print("== " + f)
            with open(f, errors="replace") as fh:
                print("".join(fh.readlines()[-15:]))
        self.cleanup()
        sys.exit(1)

    def cleanup(self):
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        if not os.environ.get("KEEP_W"):
            shutil.rmtree(self.w, ignore_errors=True)

    def done(self):
        self.cleanup()
        print("%s: %s" % (self.name, "FAILED" if self.fails else "passed"), flush=True)
        sys.exit(1 if self.fails else 0)


def needs_torch():
    """Exit 77 (skip, reason printed) when torch or the library is missing, unless CI requires them."""
    try:
        import torch  # noqa: F401
    except ImportError:
        why = "no torch in %s (deploy/setup.sh --with-torch installs python3-torch)" % PY
    else:
        why = None if library() else "no libdloco_learner.so under %s" % BIN
    if why:
        if os.environ.get("CI") == "true" or os.environ.get("DLOCO_REQUIRE_TORCH") == "1":
            print("FAIL: " + why)
            sys.exit(1)
        print("SKIP: " + why)
        sys.exit(77)
