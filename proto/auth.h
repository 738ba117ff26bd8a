/* CURVE authentication of dloco connections: key files, the allowlist of which
 * public key may speak for which learner id, and the ZAP handler that applies it.
 *
 * How the pieces fit: the synchronizer holds a CURVE key pair and binds its
 * ROUTER as a CURVE server (dl_auth_server_sock) after starting a ZAP handler
 * (dl_auth_start) in the same ZeroMQ context. Each learner holds its own key
 * pair and the synchronizer's public key (dl_auth_client_sock). During the
 * CURVE handshake libzmq asks the handler (ZeroMQ RFC 27) about the client's
 * public key; a key in the allowlist is admitted with the User-Id
 * "<learner_id> <public_z85>", which libzmq attaches to every message of that
 * connection (zmq_msg_gets(frame, "User-Id")). Anything else is refused and
 * the connection never delivers a message. Admission is per connection, so a
 * reload that revokes or re-assigns a key does not close connections already
 * admitted: the receiver checks each message with dl_auth_user_ok, which
 * consults the current allowlist.
 *
 * Z85 here means exactly 40 characters of the Z85 alphabet that decode to 32
 * bytes and re-encode to the same text (ZeroMQ RFC 32).
 *
 * Caveat of libzmq 4.3 without draft APIs (ZMQ_ZAP_ENFORCE_DOMAIN is a draft
 * option): a CURVE server whose context has no ZAP handler admits every
 * client that completes the handshake, whatever its key. So start the handler
 * before binding, and close every CURVE server socket before dl_auth_stop. */
#ifndef DL_PROTO_AUTH_H
#define DL_PROTO_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define DL_AUTH_Z85_LEN 40           /* a CURVE key in Z85: 40 chars (32 bytes) */
#define DL_AUTH_MAX_ENTRIES 65536    /* allowlist entries */
#define DL_AUTH_ID_MAX 64            /* learner id: [A-Za-z0-9._-]{1,64} (DL_WIRE_LEARNER_ID_MAX) */
#define DL_AUTH_ZAP_DOMAIN "dloco"   /* ZMQ_ZAP_DOMAIN of our CURVE servers; the handler refuses others */
/* "<learner_id> <public_z85>": the longest User-Id, chars (without the NUL). */
#define DL_AUTH_USER_ID_MAX (DL_AUTH_ID_MAX + 1 + DL_AUTH_Z85_LEN)

/* A CURVE key pair in Z85, NUL-terminated. secret_z85 is "" when only the
 * public half is known. */
typedef struct {
    char public_z85[DL_AUTH_Z85_LEN + 1];
    char secret_z85[DL_AUTH_Z85_LEN + 1];
} dl_auth_keypair;

/* ---- key files
 *
 * Text, both files:
 *   # dloco CURVE key (learner or synchronizer); keep .key secret
 *   public = <40 z85 chars>
 *   secret = <40 z85 chars>      (only in .key)
 * Readers accept '#' comment lines and blank lines anywhere, spaces or tabs
 * around '=', and CRLF line ends; any other line, or a field given twice, is
 * DL_EFORMAT "path:line: why". A key file is at most 4096 bytes. */

/* Generate a key pair (zmq_curve_keypair) and write `prefix`.key (mode 0600:
 * public + secret) and `prefix`.pub (mode 0644: public only), each fsynced.
 * The modes are set with fchmod, so the umask does not change them. Refuses
 * to overwrite: both files are created with O_EXCL, and when either already
 * exists nothing is written (a file this call created is removed again).
 * `out` (may be NULL) gets the pair. Returns 0; DL_EIO naming the file and
 * errno's reason (e.g. "create k.key: File exists"); DL_EINVAL for a prefix
 * that is empty or too long for a path; DL_ENET when libzmq has no CURVE. */
int dl_auth_keygen(const char *prefix, dl_auth_keypair *out);

/* Read a .key file into `out` (both halves). Returns 0;
 *   DL_EPERM    the file is readable or writable by group or others:
 *               "key file x.key is mode 0644: chmod 600 it";
 *   DL_EFORMAT  missing public or secret line, a value that is not Z85, an
 *               unknown or repeated line, or a public key that does not
 *               belong to the secret one (checked with zmq_curve_public);
 *   DL_EIO      open/read failed, not a regular file, larger than 4096 bytes;
 *   DL_ENET     libzmq has no CURVE (zmq_curve_public fails).
 * On failure `out` is zeroed. The secret never appears in a message. */
int dl_auth_load_keypair(const char *path, dl_auth_keypair *out);

/* A public key: `path_or_z85` is the key itself when it is exactly 40 Z85
 * characters, otherwise the path of a .pub or .key file whose public line is
 * read (a .key's secret line is ignored, and its mode not checked). A path
 * that happens to be 40 Z85 characters (they include . / -) is taken as a
 * key: write it as ./path. Returns 0; DL_EFORMAT (no public line, bad Z85,
 * bad line, "path:line: why"); DL_EIO. `out` gets the key, NUL-terminated. */
int dl_auth_load_public(const char *path_or_z85, char out[DL_AUTH_Z85_LEN + 1]);

/* 1 when `s` is a valid Z85 key (40 chars, NUL-terminated at 40), else 0. */
int dl_auth_z85_ok(const char *s);
/* 1 when `id` is a valid learner id ([A-Za-z0-9._-]{1,64}), else 0. */
int dl_auth_id_ok(const char *id);

/* ---- the allowlist
 *
 * Which public key may speak for which learner id. One learner per line:
 *   <learner_id> <public_key_z85>
 * fields separated by spaces or tabs; learner_id matches [A-Za-z0-9._-]{1,64}.
 * A line whose first non-blank character is '#' is a comment, and after the
 * key whitespace then '#' starts a trailing comment ('#' is a Z85 character,
 * so a key may itself contain one). Blank lines are ignored; a
 * CR before the line end is dropped. At most DL_AUTH_MAX_ENTRIES entries; an
 * empty list (no entries) is valid and admits nobody.
 * Every bad line is refused, DL_EFORMAT "name:line: why", whys:
 *   learner id "x y!" is not [A-Za-z0-9._-]{1,64}
 *   learner id "a": no public key
 *   learner id "a": public key "..." is not 40 Z85 characters
 *   learner id "a": trailing text "..." after the public key
 *   duplicate learner id "a" (first on line 2)
 *   learner id "b": public key already belongs to "a" (line 2)
 *   more than 65536 entries
 * (text from the file is shown with bytes outside printable ASCII as '?' and
 * cut at 64 chars). */
typedef struct dl_auth_list dl_auth_list;

/* Parse `len` bytes of allowlist text (need not be NUL-terminated; a NUL byte
 * is an ordinary bad character). `name` (NULL = "allowlist") prefixes
 * messages. On success *out is a new list to free with dl_auth_list_free;
 * on failure *out is NULL and the return is DL_EFORMAT. */
int dl_auth_list_parse(const char *text, size_t len, const char *name, dl_auth_list **out);
/* Read and parse the file at `path` (messages name it). DL_EPERM when the
 * file is writable by others ("allowlist x is mode 0666 (writable by others):
 * chmod o-w it"); DL_EIO (open/read failed, not a regular file, larger than
 * 32 MiB); DL_ENOMEM (no memory for the file's bytes); DL_EFORMAT as above. */
int dl_auth_list_load(const char *path, dl_auth_list **out);
/* Entries in the list. */
int dl_auth_list_count(const dl_auth_list *l);
/* The learner id owning this public key (Z85), or NULL (also for a string
 * that is not a key). The pointer lives as long as the list. O(1) expected. */
const char *dl_auth_list_owner(const dl_auth_list *l, const char *public_z85);
/* Free and NULL the pointer; safe on NULL and twice. */
void dl_auth_list_free(dl_auth_list **l);

/* ---- the ZAP handler
 *
 * One per ZeroMQ context: a thread with a REP socket bound at
 * inproc://zeromq.zap.01 in that context. For each request:
 *   CURVE, domain DL_AUTH_ZAP_DOMAIN, key in the current allowlist
 *        -> 200, User-Id "<learner_id> <public_z85>", empty metadata;
 *   anything else -> 400 (reasons: "unknown_key", "mechanism" (PLAIN, or NULL
 *        on a socket with a ZAP domain), "domain" (a CURVE server without
 *        DL_AUTH_ZAP_DOMAIN), "malformed" (frame count or sizes wrong, version
 *        not "1.0")).
 * Connections libzmq itself refuses never reach the handler: a NULL-mechanism
 * client against a CURVE server fails at the greeting, and a client that
 * uses the wrong server public key fails at HELLO (libzmq cannot open the
 * box); neither is counted here.
 *
 * Admissions: DL_INFO line and dl_event("auth_admitted", "id=%s address=%s").
 * Denials: counted; a DL_WARN line and one
 *   dl_event("auth_denied", "mechanism=%s address=%s key=%s reason=%s count=%llu")
 * at most once per second each, naming the latest denial (key: its full Z85
 * in the event, its first 8 chars in the log line; "none" when the request
 * had no CURVE key) and in count how many denials the line covers (the ones
 * since the previous line, the latest included); the limit is for many
 * clients at once, or a client that makes new sockets in a loop. Pending
 * denials are reported within about a second even if no new one comes.
 *
 * What a denied client sees (libzmq 4.3): its socket monitor reports
 * ZMQ_EVENT_HANDSHAKE_FAILED_AUTH with value 400, and the refusal counts as
 * a protocol error, so the socket never reconnects to that endpoint: the
 * client must notice (the monitor event, or a deadline) and make a new socket
 * to try again. Messages it queued are never delivered. */
typedef struct dl_auth dl_auth;

/* Load `allowlist_path` and start the handler of `zctx`. Must run before the
 * first CURVE server socket of the context binds. *out is a new handle or
 * NULL on failure. Returns 0; the errors of dl_auth_list_load; DL_ENET (e.g.
 * a ZAP handler is already bound in this context: "Address already in use");
 * DL_ENOMEM (the thread could not be created). */
int dl_auth_start(void *zctx, const char *allowlist_path, dl_auth **out);
/* Watch the CURVE server socket `router` (of context zctx) for handshakes
 * libzmq refuses before ZAP sees them -- a client without CURVE keys
 * (mechanism mismatch; most often seen here as the client hanging up, as it
 * notices first), a wrong server key -- and report them like denials:
 * a DL_WARN line naming the endpoint and the likely cause, and
 *   dl_event("handshake_refused", "endpoint=%s reason=hung_up|mechanism|server_key|protocol code=%u count=%llu")
 * at most once per second, count covering the refusals since the last line.
 * Call from the thread that owns router, once, after dl_auth_start. DL_ENET
 * if the monitor cannot be set up. */
int dl_auth_watch(dl_auth *a, void *zctx, void *router);
/* Re-read the allowlist file given to dl_auth_start. On any error the running
 * list stays and the error (DL_EPERM, DL_EIO, DL_EFORMAT, with the reason in
 * dl_errmsg()) is returned. On success the new list replaces the old one for
 * new connections and for dl_auth_user_ok at once, and *n_entries (may be
 * NULL) gets its count. Thread-safe against the handler thread and
 * dl_auth_user_ok (the list is swapped under a mutex). */
int dl_auth_reload(dl_auth *a, int *n_entries);
/* 1 when `user_id` (the User-Id metadata of a received message) is
 * "<id> <key>" with id == learner_id and the CURRENT allowlist grants key to
 * learner_id; 0 otherwise, including a NULL or malformed user_id or learner_id.
 * So a key removed by a reload stops being OK, and so does a key re-assigned
 * to another id (for both ids: the connection was admitted as the old one).
 * Thread-safe; O(1) expected. */
int dl_auth_user_ok(dl_auth *a, const char *user_id, const char *learner_id);
/* Split a User-Id "<id> <key>" into its learner id (out_id, NUL-terminated).
 * Returns 0, or DL_EFORMAT (NULL, no space, bad id, bad key) with out_id "". */
int dl_auth_user_id(const char *user_id, char out_id[DL_AUTH_ID_MAX + 1]);
/* Connections admitted and denied by this handler since start (either
 * pointer may be NULL). Thread-safe. */
void dl_auth_counts(dl_auth *a, uint64_t *admitted, uint64_t *denied);
/* Stop the thread (within ~100 ms), close its socket, free the handle and
 * NULL the pointer; reports pending denials first. Safe on NULL and twice.
 * Close the context's CURVE server sockets first (see the caveat at the
 * top), and call this before zmq_ctx_term. */
void dl_auth_stop(dl_auth **a);

/* ---- socket options (return 0 or DL_ENET naming the failed call) */

/* Make `sock` a CURVE server with the secret key of `server` (ZMQ_CURVE_SERVER
 * 1, ZMQ_CURVE_SECRETKEY, ZMQ_ZAP_DOMAIN DL_AUTH_ZAP_DOMAIN). Before bind. */
int dl_auth_server_sock(void *sock, const dl_auth_keypair *server);
/* Make `sock` a CURVE client with key pair `client` that trusts only the
 * server whose public key is `server_public_z85` (ZMQ_CURVE_SERVERKEY,
 * ZMQ_CURVE_PUBLICKEY, ZMQ_CURVE_SECRETKEY). Before connect. */
int dl_auth_client_sock(void *sock, const dl_auth_keypair *client, const char *server_public_z85);

#endif
