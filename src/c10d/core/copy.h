// copy_bytes: memcpy for the hot paths of the backends, without one CPU pathology.
//
// glibc copies mid-sized blocks (a few KiB to about a MiB) with `rep movsb`, which on some
// CPUs (AMD Zen among them) runs about 20x slower when the destination lies 1-63 bytes past
// the source modulo 4 KiB. That is the common case of copying a page-aligned shared buffer into
// a large numpy array, whose data starts 16 bytes into its first page. Those copies take a
// plain vector loop, and so does every copy from 16 KiB on CPUs with AVX2: where glibc picks
// `rep movsb` (up to about the L2 size on AMD) a 32-byte load/store loop is faster even
// without the pathology. EPYC Zen 4 guest, one thread, 256 KiB: 57 GB/s against 54 for
// memcpy; 2-rank all_reduce of 4 MiB (medians of 3 interleaved launches): 181-187 us against
// 189-196, of 1 MiB 47-48 against 50-51. Every other copy is memcpy.
#pragma once

#include <cstddef>

namespace c10d::core {

void copy_bytes(void* dst, const void* src, size_t n);

// Copies with non-temporal stores (falls back to copy_bytes off x86-64 and below a few KiB),
// ending with a store fence, so a release store that follows also orders these stores.
//
// For buffers another core reads after every write, such as the slots of a shared-memory
// backend: a plain store first has to take the line back from the reader's cache. On some
// machines (seen on KVM guests, most likely while the vCPUs sit in different core complexes)
// that costs 5-7x the copy itself; streaming stores skip the line fill and the reader gets the
// data from memory.
void stream_bytes(void* dst, const void* src, size_t n);

}  // namespace c10d::core
