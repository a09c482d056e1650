// copy_bytes: memcpy for the hot paths of the backends, without one CPU pathology and with
// the faster of two copies on the CPU it runs on.
//
// glibc copies mid-sized blocks (a few KiB to about a MiB) with `rep movsb`, which on some
// CPUs (AMD Zen 4 among them) runs about 20x slower when the destination lies 1-63 bytes past
// the source modulo 4 KiB. That is the common case of copying a page-aligned shared buffer into
// a large numpy array, whose data starts 16 bytes into its first page. Those copies take a
// plain vector loop. From 16 KiB, on CPUs with AVX2, copies take either a 32-byte load/store
// loop or `rep movsb`, whichever a timing of both at the first such copy found faster (for
// aliased destinations and for the others; C10D_COPY forces one): which one wins differs by
// CPU (measurements in docs/design/shm.md#copy-kernels). Copies too large for the last-level
// cache (from 3/8 of it: source and destination overflow it) take streaming stores.
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

namespace detail {

// The size from which copy_bytes takes streaming stores.
size_t stream_from();

// Which copy copy_bytes runs from 16 KiB on AVX2 CPUs: `rep movsb` (true) or the vector loop,
// for destinations 1-63 bytes past the source modulo 4 KiB and for the others. Tests switch it
// to run both; switching is atomic but meant for tests only.
struct CopyKernels {
  bool string_plain = false;
  bool string_aliased = false;
};
CopyKernels copy_kernels();
void set_copy_kernels(CopyKernels kernels);

}  // namespace detail

}  // namespace c10d::core
