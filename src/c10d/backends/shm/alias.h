// Aliases: ordinary memory moved into a rank's shared heap, so that collectives on it take
// the zero-copy path of tensors from ShmBackend::empty().
//
// adopt() copies the whole pages inside a buffer into a block of the heap and maps that block
// over the same addresses (MAP_FIXED | MAP_SHARED): the buffer keeps its address and contents,
// and its pages are now ones the peers have mapped already. The bytes before the first page
// boundary and after the last stay where they were; the backend moves them through the kernel.
//
// release_alias() undoes it for a buffer about to be freed: the pages get fresh private memory
// again, the block's pages go back to the system and
// the block to the heap. It must run before the memory is freed (the Python layer calls it
// from a weak reference's callback of the numpy array that owns the memory, which numpy runs
// before it frees the data). It leaves alone any page that /proc/self/maps no longer shows as
// the block's, so memory unmapped and reused meanwhile is never touched; a block whose pages
// could not all be made private again stays allocated. When the backend shuts down, its
// aliases are undone the same way (release_aliases_of).
//
// Nothing may write into the buffer while it is adopted (the shm backend adopts only when no
// operation of it is queued or running).
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

// Moves the whole pages of [data, data + bytes) into `segment`'s heap (this rank's). False,
// with nothing changed, when they:
// - are fewer than kPageAlignedBlockBytes (the heap aligns only such blocks to pages);
// - overlap an alias already;
// - are not private anonymous read-write memory (malloc's);
// - would take the aliases past half of the heap (the rest stays for empty()).
bool adopt_into_heap(const std::shared_ptr<Segment>& segment, void* data, size_t bytes);

// Undoes adopt_into_heap() for the buffer [data, data + bytes), whose memory is about to be
// freed: its pages come back zeroed. A no-op when it has no alias.
void release_alias(void* data, size_t bytes);

// Undoes every alias in `segment`'s heap, keeping the buffers' contents (at shutdown).
void release_aliases_of(const Segment& segment);

// Where [data, data + bytes) meets an alias of `segment`'s heap.
AliasedPart find_alias(const Segment& segment, const void* data, size_t bytes);

// Number of live aliases in this process (for tests).
size_t alias_count();

}  // namespace c10d::backends::shm
