// Aliases: ordinary memory moved into a rank's shared heap, so that collectives on it take
// the zero-copy path of tensors from ShmBackend::empty().
//
// adopt_into_heap() copies the whole pages inside the buffer of an operation about to run (an
// all_reduce's or broadcast's tensor, the input of an all_gather, gather or all_to_all, a
// message sent: nothing may write it while the operation is in flight) into a block of the
// heap and maps that block over the same addresses (MAP_FIXED | MAP_SHARED): the buffer keeps its
// address and contents, and its pages are now ones the peers have mapped already. No byte outside
// that buffer is copied or remapped, so writes to the rest of the array that owns it are never
// lost. The bytes before the first page boundary and after the last stay where they were.
//
// An alias is a fact about the address space, checked before every use: find_alias() trusts
// a record only while its first and last pages are still shared pages (/proc/self/pagemap);
// memory that numpy freed and mapped again is private, and the record is dropped.
//
// release_aliases_in() undoes the aliases inside an array about to be freed (the Python layer
// calls it from a weak reference's callback of the numpy array that owns the memory, which
// numpy runs before it frees the data): the pages get fresh private memory, the block goes
// back to the heap. forget_aliases_in() drops the records of memory the owner no longer holds,
// touching no page. Both leave alone any page that /proc/self/maps no longer shows as the
// block's; a block some page still maps stays allocated. Shutting the backend down undoes
// nothing (another thread may be writing into the arrays): aliases keep the segment alive, as
// empty()'s tensors do, until their arrays are freed.
//
// fork(): a child would share an aliased buffer's pages with its parent. Fork handlers give
// the child a private copy of each instead, taken by the parent just before the fork (the
// snapshot fork gives private memory; it costs a copy of every adopted buffer per fork), and
// the child forgets them.
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace c10d::backends::shm {

class Segment;

// The part of [data, data + bytes) that lies in an alias of `segment`'s heap: bytes [lo, hi)
// of the buffer are the heap's bytes from `heap_offset` on. Empty (lo == hi) when none does.
struct AliasedPart {
  size_t lo = 0;
  size_t hi = 0;
  size_t heap_offset = 0;
};

// Moves the whole pages of [data, data + bytes), the buffer of an operation this thread is
// about to run, into `segment`'s heap (this rank's). False, with nothing changed, when they:
// - are fewer than kPageAlignedBlockBytes (the heap aligns only such blocks to pages);
// - overlap a live alias (records of pages no longer mapped from their block are dropped);
// - are not private anonymous read-write memory (malloc's);
// - would take the aliases past half of the heap (the rest stays for empty());
// - cannot be checked later (no readable /proc/self/pagemap).
bool adopt_into_heap(const std::shared_ptr<Segment>& segment, void* data, size_t bytes);

// Undoes every alias inside [data, data + bytes), memory about to be freed: its pages come
// back zeroed.
void release_aliases_in(const void* data, size_t bytes);

// Drops the records of the aliases inside [data, data + bytes), memory its owner no longer
// holds (numpy freed or replaced it), without touching any page.
void forget_aliases_in(const void* data, size_t bytes);

// Where [data, data + bytes), a live buffer of the caller's, meets an alias of `segment`'s
// heap whose pages are still mapped from its block. Without `verify` the record is taken as it
// is (for decisions that a stale record cannot make unsafe; it costs two reads of pagemap).
AliasedPart find_alias(const Segment& segment, const void* data, size_t bytes, bool verify = true);

// The part of [data, data + bytes) that this rank's peers have mapped: all of it when it lies
// in `segment`'s heap (heap_offset), else the part find_alias() finds (verified).
AliasedPart mapped_part(const Segment& segment, const void* data, size_t bytes);

// Number of live aliases in this process (for tests).
size_t alias_count();

}  // namespace c10d::backends::shm
