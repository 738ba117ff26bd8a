# Event-log queries of the tests (sourced): count, read and wait for events
# in the logfmt files written by --events (docs/EVENTS.md).
#
# FILE is one events file, or - for stdin (e.g.
# `cat "$W"/events-l*.log | ev_count - ack decision=accepted`). CONDs select lines: key=value (the whole value, unquoted) or key~regex (an
# awk ERE matched against the value). Keys match exactly, never as substrings.
EV_AWK='
function lf_unescape(v,   out, i, c) {
  if (index(v, "\\") == 0) return v
  out = ""
  for (i = 1; i <= length(v); i++) {
    c = substr(v, i, 1)
    if (c == "\\") { i++; c = substr(v, i, 1); if (c == "n") c = "\n"; else if (c == "t") c = "\t"; else if (c == "r") c = "\r" }
    out = out c
  }
  return out
}
function lf_parse(s, kv,   tok, eq) {
  split("", kv)
  while (s != "") {
    sub(/^ +/, "", s)
    if (s == "") break
    if (match(s, /^[^ ="]+="([^"\\]|\\.)*"/)) {
      tok = substr(s, 1, RLENGTH); s = substr(s, RLENGTH + 1); eq = index(tok, "=")
      kv[substr(tok, 1, eq - 1)] = lf_unescape(substr(tok, eq + 2, length(tok) - eq - 2))
    } else if (match(s, /^[^ ="]+=[^ ]*/)) {
      tok = substr(s, 1, RLENGTH); s = substr(s, RLENGTH + 1); eq = index(tok, "=")
      kv[substr(tok, 1, eq - 1)] = substr(tok, eq + 1)
    } else sub(/^[^ ]+/, "", s) # not logfmt: skip the word
  }
}
BEGIN {
  nc = split(ENVIRON["EV_CONDS"], cs, "\034"); n = 0
  for (i = 1; i <= nc; i++) {
    if (cs[i] == "") continue
    match(cs[i], /^[A-Za-z0-9_]+/)
    if (RLENGTH < 1) { print "ev: bad condition " cs[i] > "/dev/stderr"; exit 2 }
    n++; ck[n] = substr(cs[i], 1, RLENGTH); cop[n] = substr(cs[i], RLENGTH + 1, 1); cv[n] = substr(cs[i], RLENGTH + 2)
    if (cop[n] != "=" && cop[n] != "~") { print "ev: bad condition " cs[i] > "/dev/stderr"; exit 2 }
  }
  nk = split(key, keys, " "); count = 0
}
index($0, " event=" ev) {
  lf_parse($0, kv)
  if (kv["event"] != ev) next
  for (i = 1; i <= n; i++) {
    if (!(ck[i] in kv)) next
    if (cop[i] == "=" && kv[ck[i]] != cv[i]) next
    if (cop[i] == "~" && kv[ck[i]] !~ cv[i]) next
  }
  count++
  if (nk == 0) next
  line = ""
  for (i = 1; i <= nk; i++) { if (!(keys[i] in kv)) next; line = line (i > 1 ? " " : "") kv[keys[i]] }
  print line
}
END { if (key == "") print count }
'
ev_awk_() { # FILE EVENT KEY CONDS...
  local f=$1 ev=$2 key=$3; shift 3
  if [ "$f" != - ] && [ ! -f "$f" ]; then [ -z "$key" ] && echo 0; return 0; fi
  EV_CONDS="$(printf '%s\034' "$@")" awk -v ev="$ev" -v key="$key" "$EV_AWK" "$f"
}
ev_count() { local f=$1 ev=$2; shift 2; ev_awk_ "$f" "$ev" "" "$@"; }             # FILE EVENT [COND...] -> lines
# FILE EVENT "KEY [KEY...]" [COND...] -> the keys' values, space-separated, one line per event that has them all
ev_field() { local f=$1 ev=$2 k=$3; shift 3; ev_awk_ "$f" "$ev" "$k" "$@"; }
ev_last() { ev_field "$@" | tail -n 1; }                                            # FILE EVENT KEY [COND...] -> last value
ev_has() { [ "$(ev_count "$@")" -gt 0 ]; }                                          # FILE EVENT [COND...]
ev_wait() { # SECONDS FILE EVENT [COND...]: 0 once such an event is in FILE, 1 at the deadline
  local deadline=$(( $(date +%s) + $1 )); shift
  until ev_has "$@"; do [ "$(date +%s)" -lt "$deadline" ] || return 1; sleep 0.2; done
}
