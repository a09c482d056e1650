// all_reduce on every backend an installed c10d has, among the processes that share a
// FileStore:  allreduce <store file> <rank> <world size>
// Exits 0 when every rank's sum is exact, 1 (with a message) otherwise.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "c10d/config.h"
#include "c10d/pg/process_group.h"
#include "c10d/store/file_store.h"
#include "c10d/store/prefix_store.h"
#if C10D_WITH_GLOO
#include "c10d/backends/gloo/gloo_backend.h"
#endif
#if C10D_WITH_SHM
#include "c10d/backends/shm/shm_backend.h"
#endif

using namespace c10d;

namespace {

template <typename MakeBackend>
bool check(const char* name, const std::shared_ptr<store::Store>& base, int rank, int world,
           MakeBackend make) {
  auto st = std::make_shared<store::PrefixStore>(name, base);
  auto group = std::make_shared<pg::ProcessGroup>(st, rank, world);
  group->register_backend(core::DeviceType::kCPU, make(st));
  const int64_t n = 1 << 20;
  std::vector<core::Tensor> tensors = {core::Tensor::empty({n}, core::DType::kFloat32)};
  float* x = tensors[0].data_as<float>();
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 7);
  group->allreduce(tensors)->wait();
  const float ranks = static_cast<float>(world * (world + 1) / 2);
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != ranks * static_cast<float>(i % 7)) {
      std::fprintf(stderr, "%s rank %d: element %lld is %g, expected %g\n", name, rank,
                   static_cast<long long>(i), x[i], ranks * static_cast<float>(i % 7));
      return false;
    }
  }
  std::printf("%s rank %d of %d: all_reduce of %lld floats exact\n", name, rank, world,
              static_cast<long long>(n));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <store file> <rank> <world size>\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[2]);
  const int world = std::atoi(argv[3]);
  try {
    auto base = std::make_shared<store::FileStore>(argv[1], world);
    bool ok = true;
#if C10D_WITH_GLOO
    ok = check("gloo", base, rank, world,
               [&](auto st) {
                 return std::make_shared<backends::gloo::GlooBackend>(st, rank, world);
               }) &&
         ok;
#endif
#if C10D_WITH_SHM
    ok = check("shm", base, rank, world,
               [&](auto st) {
                 return std::make_shared<backends::shm::ShmBackend>(st, rank, world);
               }) &&
         ok;
#endif
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
}
