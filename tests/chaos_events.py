"""The event logs of a dloco-chaos run, for the Python checks inside the test
scripts (test_partition_work.sh, test_wan_downlink.sh): logfmt events as
dicts, a check that prints ok/FAIL and counts failures, the partition's window."""
import re
import sys

failures = 0


def events(path):
    """Each event line of a logfmt log as a dict; ts as an int (ns)."""
    for line in open(path):
        kv = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))
        if "ts" in kv and "event" in kv:
            kv["ts"] = int(kv["ts"])
            yield kv


def check(ok, what):
    global failures
    print(("ok: " if ok else "FAIL: ") + what)
    failures += not ok


def partition_window(run_dir, name="partition"):
    """(begin, end) ts of the run's partition fault; exits failing when it did not begin and end."""
    cut = [e["ts"] for e in events(run_dir + "/events-chaos.log")
           if e["event"] == "fault" and e.get("kind") == "partition"]
    if len(cut) < 2:
        print("FAIL: the %s did not begin and end" % name)
        sys.exit(1)
    return cut[0], cut[1]
