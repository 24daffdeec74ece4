"""The prefix cache (``kv.prefix_cache=block_hash``): full KV blocks kept by content and shared.

Every full block of a request's prompt has a chain hash (its content and all the blocks
before it, :func:`replay.engine.requests.prefix_block_hashes`), so two requests share block
``k`` only if their prompts agree up to its end. The cache is a set of *entries*, one
physical block each, found by hash:

* **Hits.** When a request starts, the leading blocks of its prompt whose hashes are cached
  are not computed again: its prefill starts after them (at least one prompt token is
  always computed, as in vLLM), and it *references* their entries instead of holding blocks
  of its own.
* **Inserts.** As a request's prefill fills full blocks, each becomes an entry (or, if an
  entry with its hash appeared meanwhile, the request references that one instead and its
  own copy is freed).
* **Free entries.** An entry no request references stays cached, free, and is reclaimed
  (least recently freed first: ``lru``; or oldest first: ``fifo``) when a step needs the
  memory. Entries count against ``M`` whether referenced or free: the physical blocks in
  use are the running requests' private blocks plus every entry.

A request's own blocks are ``blocks(held) - n_ref``: its ``n_ref`` leading blocks are
references. With the cache off nothing here runs and every count is zero.
"""

from __future__ import annotations

from replay.engine.jit import jit
from replay.engine.paging import blocks

#: ``EngineState.cache_rule``: which free entry a reclaim takes first.
LRU, FIFO = 0, 1
EMPTY = -1
#: The latest removals the lookups' memo keeps (a power of two): a request not looked up for
#: more removals than this walks its chain again from the start.
REMOVAL_LOG = 4096
#: Rows of ``EngineState.lookup_memo`` (one array, so a lookup reads one array, not three):
#: the chain found, ``cache_removals`` then (-1: never looked up), and ``entry_counter`` then
#: if the chain ended at a missing block (else -1). Rows of ``removal_log``: hash, position.
LOOKUP_CHAIN, LOOKUP_REMOVALS, LOOKUP_INSERTS = 0, 1, 2
LOGGED_HASH, LOGGED_DEPTH = 0, 1


@jit(inline="always")
def blocks_in_use(s):
    """Physical blocks in use: the running requests' blocks, shared ones once, plus every
    cache entry (free ones included)."""
    return s.blocks_held - s.shared_refs + s.cache_entries


@jit(inline="always")
def find_in(table, entry_hash, key):
    """The entry holding ``key`` in ``table``, or -1."""
    mask = table.size - 1
    slot = key & mask
    while True:
        entry = table[slot]
        if entry == EMPTY:
            return EMPTY
        if entry_hash[entry] == key:
            return entry
        slot = (slot + 1) & mask


@jit(inline="always")
def hit_limit(hash_count, prefill_len, block):
    """The most leading blocks a request's prefill may take from the cache: its full blocks
    with known content, leaving at least one prompt token to compute."""
    return max(0, min(hash_count, (prefill_len - 1) // block))


@jit
def _unlink(s, entry):
    """Take free ``entry`` off the free list."""
    prev, nxt = s.entry_prev[entry], s.entry_next[entry]
    if prev == EMPTY:
        s.free_head = nxt
    else:
        s.entry_next[prev] = nxt
    if nxt == EMPTY:
        s.free_tail = prev
    else:
        s.entry_prev[nxt] = prev
    s.cache_free -= 1


@jit
def _link_free(s, entry):
    """``entry`` joins the free list: at the tail (``lru``), or in insertion order
    (``fifo``)."""
    s.cache_free += 1
    after = s.free_tail
    if s.cache_rule == FIFO:
        seq = s.entry_seq[entry]
        while after != EMPTY and s.entry_seq[after] > seq:
            after = s.entry_prev[after]
    nxt = s.free_head if after == EMPTY else s.entry_next[after]
    s.entry_prev[entry], s.entry_next[entry] = after, nxt
    if after == EMPTY:
        s.free_head = entry
    else:
        s.entry_next[after] = entry
    if nxt == EMPTY:
        s.free_tail = entry
    else:
        s.entry_prev[nxt] = entry


@jit
def _reference(s, entry):
    if s.entry_ref[entry] == 0:
        _unlink(s, entry)
    s.entry_ref[entry] += 1


@jit(inline="always")
def lookup_hits(s, rid):
    """How many leading blocks of waiting ``rid``'s prefill are cached now (at least one
    prompt token is left to compute): :func:`lookup_hits_of` for one request."""
    # most chat prompts are shorter than a block and a token: no need to read the dozen
    # arrays of a lookup
    if hit_limit(s.hash_count[rid], s.prefill_len[rid], s.block) == 0:
        return 0
    one = s.lookup_one
    one[0] = rid
    lookup_hits_of(s, one, 0, 1, one)
    return one[0]


@jit
def lookup_hits_of(s, ids, first, n, hits):
    """How many leading blocks of each waiting request ``ids[first:first + n]``'s prefill are
    cached now (at least one prompt token is left to compute), into ``hits[:n]`` (which may
    be ``ids[first:]`` itself). The entries found are written beside the hashes
    (``ref_entry``), where :func:`pin_hits`, :func:`free_among_hits` and :func:`acquire` read
    them without probing the table again.

    A waiting request is looked up at every step it waits (by the policy, and again when it
    starts), and a long shared prefix is many probes each time, so the chain found is kept.
    Removals since cut it at the first removed block on it (the log of removals says which
    hash left at which position; a request not looked up for longer than the log is walked
    again from the start), and the walk goes on from there, or from where it stopped before:
    not at all if no entry was added since and it stopped at a missing block (not merely at
    the limit, which grows when an evicted request comes back to recompute its answer too).

    The state's arrays are read once here and the walk is written out, not called: each read
    of a record's array, and each array passed to a function (even an inlined one), takes and
    drops a reference (two atomic operations), which for a policy's window of 128 lookups
    per step measured as most of its cost."""
    hash_start, hash_count, prefill_len, block = s.hash_start, s.hash_count, s.prefill_len, s.block
    hashes, ref_entry, table, entry_hash = s.hashes, s.ref_entry, s.cache_table, s.entry_hash
    memo, log = s.lookup_memo, s.removal_log
    removals, inserts = s.cache_removals, s.entry_counter
    for i in range(n):
        rid = ids[first + i]
        start = hash_start[rid]
        chain = memo[LOOKUP_CHAIN, rid]
        seen = memo[LOOKUP_REMOVALS, rid]
        if seen != removals:
            if removals - seen > REMOVAL_LOG or seen < 0:
                chain = 0
            else:
                for j in range(seen, removals):
                    depth = log[LOGGED_DEPTH, j & (REMOVAL_LOG - 1)]
                    if depth < chain and hashes[start + depth] == log[LOGGED_HASH,
                                                                      j & (REMOVAL_LOG - 1)]:
                        chain = depth
            if chain < memo[LOOKUP_CHAIN, rid]:
                memo[LOOKUP_INSERTS, rid] = -1
            memo[LOOKUP_REMOVALS, rid] = removals
        limit = hit_limit(hash_count[rid], prefill_len[rid], block)
        if memo[LOOKUP_INSERTS, rid] != inserts:
            while chain < limit:  # the walk: each next block's hash, until one is missing
                entry = find_in(table, entry_hash, hashes[start + chain])
                if entry == EMPTY:
                    break
                ref_entry[start + chain] = entry
                chain += 1
            memo[LOOKUP_INSERTS, rid] = inserts if chain < limit else -1
        memo[LOOKUP_CHAIN, rid] = chain
        hits[i] = min(chain, limit)


@jit
def acquire(s, rid, hits):
    """``rid`` starts with its first ``hits`` blocks taken from the cache (found by this step's
    :func:`lookup_hits` and pinned since: still the entries it wrote)."""
    start, ref_entry = s.hash_start[rid], s.ref_entry
    for k in range(hits):
        _reference(s, ref_entry[start + k])
    s.n_ref[rid] = hits
    s.shared_refs += hits


@jit
def _new_entry(s, key, depth):
    """A new entry holding ``key``, the block at position ``depth`` of a prompt, referenced
    once; returns its id."""
    entry = s.entry_stack[s.n_entry_stack - 1]
    s.n_entry_stack -= 1
    s.entry_hash[entry] = key
    s.entry_depth[entry] = depth
    s.entry_ref[entry] = 1
    s.entry_seq[entry] = s.entry_counter
    s.entry_counter += 1
    table, mask = s.cache_table, s.cache_table.size - 1
    slot = key & mask
    while table[slot] != EMPTY:
        slot = (slot + 1) & mask
    table[slot] = entry
    s.cache_entries += 1
    return entry


@jit
def insert_full_blocks(s, rid):
    """``rid``'s full blocks with known content beyond its references become references:
    new entries, or existing ones with the same hash (its own copy freed)."""
    insert_blocks(s, rid, s.held[rid] // s.block)


@jit
def insert_blocks(s, rid, full):
    """As :func:`insert_full_blocks` for ``rid`` holding ``full`` full blocks (the decode
    stretch writes ``held`` only at its end)."""
    full = min(full, s.hash_count[rid])
    have = s.n_ref[rid]
    if full <= have:
        return
    start, hashes, ref_entry = s.hash_start[rid], s.hashes, s.ref_entry
    table, entry_hash = s.cache_table, s.entry_hash
    for k in range(have, full):
        key = hashes[start + k]
        entry = find_in(table, entry_hash, key)
        if entry == EMPTY:
            entry = _new_entry(s, key, k)
        else:
            _reference(s, entry)
        ref_entry[start + k] = entry
    s.n_ref[rid] = full
    s.shared_refs += full - have


@jit
def release(s, rid):
    """``rid`` stops referencing its entries (it completed, was evicted or dropped); those no
    one references any more stay cached, free. Its last block is released first, as vLLM
    frees a request's blocks in reverse: a reclaim takes a prefix's tail before its head,
    whose loss would strand every block after it."""
    start, ref_entry, entry_ref = s.hash_start[rid], s.ref_entry, s.entry_ref
    for k in range(s.n_ref[rid] - 1, -1, -1):
        entry = ref_entry[start + k]
        entry_ref[entry] -= 1
        if entry_ref[entry] == 0:
            _link_free(s, entry)
    s.shared_refs -= s.n_ref[rid]
    s.n_ref[rid] = 0


@jit
def _remove(s, entry):
    """Delete ``entry`` from the hash table (backward-shift deletion keeps probes short)."""
    table, mask = s.cache_table, s.cache_table.size - 1
    slot = s.entry_hash[entry] & mask
    while table[slot] != entry:
        slot = (slot + 1) & mask
    hole = slot
    slot = (slot + 1) & mask
    while table[slot] != EMPTY:
        home = s.entry_hash[table[slot]] & mask
        # the element at slot may move into the hole if its home is not in (hole, slot]
        if (slot > hole and (home <= hole or home > slot)) or (
                slot < hole and home <= hole and home > slot):
            table[hole] = table[slot]
            hole = slot
        slot = (slot + 1) & mask
    table[hole] = EMPTY
    s.entry_stack[s.n_entry_stack] = entry
    s.n_entry_stack += 1
    s.cache_entries -= 1
    log, logged = s.removal_log, s.cache_removals & (REMOVAL_LOG - 1)
    log[LOGGED_HASH, logged] = s.entry_hash[entry]
    log[LOGGED_DEPTH, logged] = s.entry_depth[entry]
    s.cache_removals += 1


@jit
def new_pins(s):
    """A new step: no entry is pinned."""
    s.pin_stamp += 1
    s.pinned_free = 0


@jit
def pin_hits(s, rid, hits):
    """``rid`` starts this step with its first ``hits`` blocks from the cache: no reclaim of
    this step may take them (it takes its references only once the step executes)."""
    start, stamp, ref_entry, entry_pin = s.hash_start[rid], s.pin_stamp, s.ref_entry, s.entry_pin
    for k in range(hits):
        entry = ref_entry[start + k]  # found by lookup_hits just before
        if entry_pin[entry] != stamp:
            entry_pin[entry] = stamp
            if s.entry_ref[entry] == 0:
                s.pinned_free += 1


@jit
def reclaimable(s):
    """Free entries a reclaim of this step may take: the unpinned ones."""
    return s.cache_free - s.pinned_free


@jit
def reclaim(s, k):
    """Free ``k`` unpinned unreferenced entries for memory, in the cache's reclaim order."""
    entry = s.free_head
    for _ in range(k):
        while s.entry_pin[entry] == s.pin_stamp:
            entry = s.entry_next[entry]
        following = s.entry_next[entry]
        _unlink(s, entry)
        _remove(s, entry)
        entry = following
    s.cache_reclaimed += k


@jit(inline="always")
def cached_blocks(s, rid):
    """Blocks of waiting ``rid``'s prefill found in the prefix cache now (0 with it off): what
    a policy sees of the cache, and what the engine will take when ``rid`` starts."""
    if not s.cache_on:
        return 0
    return lookup_hits(s, rid)


@jit
def blocks_taken(s):
    """Blocks the running requests occupy, each shared block once, free cache entries not
    counted (a policy may plan with those: the engine reclaims them when it needs room)."""
    return s.blocks_held - s.shared_refs + s.cache_entries - s.cache_free


@jit
def free_among_hits(s, rid, hits):
    """How many of ``rid``'s first ``hits`` cached blocks are free entries: admitting it takes
    them out of the blocks a policy may allocate (as vLLM counts a hit on a block in its free
    queue as a block allocated). Counted per request: two admissions of one decision that
    find the same free entry count it twice, a block more than vLLM would."""
    start, n, ref_entry, entry_ref = s.hash_start[rid], 0, s.ref_entry, s.entry_ref
    for k in range(hits):  # the entries cached_blocks found just before
        if entry_ref[ref_entry[start + k]] == 0:
            n += 1
    return n


@jit
def blocks_freed_by(s, rid):
    """Blocks that preempting running ``rid`` gives back to what a policy may allocate: its
    own, and the entries no other request references (they stay cached, free). An entry two
    victims of one decision share counts for neither (the count does not follow the
    decision's earlier victims): at most a few blocks fewer than vLLM would count."""
    n = blocks(s.held[rid], s.block)
    if s.cache_entries - s.cache_free == s.shared_refs:
        return n  # each referenced entry has one reference: all of them are rid's alone
    start, n_ref = s.hash_start[rid], s.n_ref[rid]
    ref_entry, entry_ref = s.ref_entry, s.entry_ref
    n -= n_ref
    for k in range(start, start + n_ref):
        if entry_ref[ref_entry[k]] == 1:
            n += 1
    return n
