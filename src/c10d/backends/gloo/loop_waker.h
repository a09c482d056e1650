// LoopWaker: keeps a Gloo TCP device's event loop turning while connections are set up or torn
// down. Gloo (Debian's 2022 build) makes a thread that unregisters a socket, or destroys the
// device, wait until the loop comes round, and an idle loop sleeps 10 ms in epoll_wait: without
// a waker, creating a group cost ~10 ms per device whatever the network did.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <gloo/transport/device.h>
#include <gloo/transport/tcp/loop.h>

namespace c10d::backends::gloo {

class LoopWaker final : public ::gloo::transport::tcp::Handler {
 public:
  // Registers an eventfd with `device`'s loop and pokes it every `period` until destroyed. A
  // device of another transport gets no waker (nothing happens).
  explicit LoopWaker(const std::shared_ptr<::gloo::transport::Device>& device,
                     std::chrono::microseconds period = std::chrono::microseconds(100));
  ~LoopWaker() override;

  static std::vector<std::unique_ptr<LoopWaker>> for_devices(
      const std::vector<std::shared_ptr<::gloo::transport::Device>>& devices);

  LoopWaker(const LoopWaker&) = delete;
  LoopWaker& operator=(const LoopWaker&) = delete;

  // Stops holding the device, so that the caller's release can destroy it while the loop is
  // still poked (Gloo's loop joins its thread at its next turn). A device that is gone by the
  // waker's destruction took its epoll set with it; one still alive is left as usual.
  void release_device() { device_.reset(); }

  void handleEvents(int events) override;

 private:
  void poke() const;

  std::shared_ptr<::gloo::transport::Device> device_;
  std::weak_ptr<::gloo::transport::Device> weak_device_;
  int fd_ = -1;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;      // the poker ends
  bool unregistered_ = false;  // the loop thread has dropped our descriptor
  std::thread poker_;
};

}  // namespace c10d::backends::gloo
