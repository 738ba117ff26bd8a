/* The shard layout of a sharded synchronizer: which of S dloco-sync
 * processes owns fragment p. One pure rule that learners, synchronizers and
 * the store checker all use. */
#ifndef DL_CORE_SHARD_H
#define DL_CORE_SHARD_H

/* The rule: fragment p belongs to shard p % S (S = shards). The plan's
 * fragments are near-equal in bytes (core/plan.h: whole tensors packed by
 * LPT, big ones poured in row blocks), so dealing them out round-robin
 * balances the shards' bytes too (`dloco plan --shards S` prints them); and
 * every shard owns at least one fragment when S <= P.
 *
 * shards <= 1 means unsharded: one synchronizer owns every fragment (a
 * store or a Welcome from before sharding says 0). A layout is valid when
 * shards <= 1 and shard == 0, or 1 < shards <= P and 0 <= shard < shards. */
/* The shard that owns fragment p (0 when shards <= 1). p >= 0 (asserted). */
int dl_shard_of(int p, int shards);
/* 1 when shard `shard` of `shards` owns fragment p. */
int dl_shard_owns(int p, int shard, int shards);
/* Fragments of P that shard `shard` of `shards` owns. */
int dl_shard_count(int P, int shard, int shards);
/* The fragments shard `shard` of `shards` owns, ascending, into out
 * (room for dl_shard_count of them); returns that count. */
int dl_shard_fragments(int P, int shard, int shards, int *out);
/* 0 when (shard, shards) is a valid layout for P fragments, else DL_EINVAL
 * with the reason in dl_errmsg(). */
int dl_shard_check(int P, int shard, int shards);

#endif
