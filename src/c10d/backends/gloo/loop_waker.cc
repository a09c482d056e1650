#include "c10d/backends/gloo/loop_waker.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

#include <gloo/transport/tcp/device.h>

namespace c10d::backends::gloo {

namespace tcp = ::gloo::transport::tcp;

LoopWaker::LoopWaker(const std::shared_ptr<::gloo::transport::Device>& device,
                     std::chrono::microseconds period) {
  auto* device_tcp = dynamic_cast<tcp::Device*>(device.get());
  if (device_tcp == nullptr) return;
  fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) return;  // only speed is lost
  device_ = device;
  weak_device_ = device;
  device_tcp->registerDescriptor(fd_, EPOLLIN, this);
  poker_ = std::thread([this, period] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!cv_.wait_for(lock, period, [this] { return stopping_ && unregistered_; })) poke();
  });
}

std::vector<std::unique_ptr<LoopWaker>> LoopWaker::for_devices(
    const std::vector<std::shared_ptr<::gloo::transport::Device>>& devices) {
  std::vector<std::unique_ptr<LoopWaker>> wakers;
  for (const auto& device : devices) wakers.push_back(std::make_unique<LoopWaker>(device));
  return wakers;
}

LoopWaker::~LoopWaker() {
  if (fd_ < 0) return;
  bool left = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!device_) device_ = weak_device_.lock();
    stopping_ = true;
    // A thread other than the loop's waits a whole turn to unregister; the loop thread does it
    // in handleEvents at the next poke. A device already destroyed has no loop to leave.
    left =
        !device_ || cv_.wait_for(lock, std::chrono::seconds(1), [this] { return unregistered_; });
    unregistered_ = true;  // the poker ends
  }
  cv_.notify_all();
  poker_.join();
  // A loop busy for a whole second: leave it the slow way, which waits for its next turn.
  if (!left) static_cast<tcp::Device*>(device_.get())->unregisterDescriptor(fd_, this);
  ::close(fd_);
}

void LoopWaker::poke() const {
  const uint64_t one = 1;
  (void)!::write(fd_, &one, sizeof(one));
}

void LoopWaker::handleEvents(int /*events*/) {
  uint64_t count = 0;
  (void)!::read(fd_, &count, sizeof(count));
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_ && !unregistered_ && device_) {
    static_cast<tcp::Device*>(device_.get())->unregisterDescriptor(fd_, this);
    unregistered_ = true;
    cv_.notify_all();
  }
}

}  // namespace c10d::backends::gloo
