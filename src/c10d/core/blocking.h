// A thread's "about to block" notice. The Python inline path keeps the GIL through a small
// synchronous collective, since releasing and retaking it costs about as much as the
// collective's own synchronisation; it registers a notice here instead, and the code that
// may wait for long (a peer that has not arrived, a queue, a lock another thread holds)
// calls before_blocking() first, which releases the GIL then. A notice fires at most once.
#pragma once

namespace c10d::core {

using BlockingNotice = void (*)(void* context);

// Installs `notice` for this thread for the scope's lifetime (the previous one, if any, comes
// back when it ends). A notice that has fired stays spent.
class BlockingNoticeScope {
 public:
  BlockingNoticeScope(BlockingNotice notice, void* context);
  ~BlockingNoticeScope();
  BlockingNoticeScope(const BlockingNoticeScope&) = delete;
  BlockingNoticeScope& operator=(const BlockingNoticeScope&) = delete;

 private:
  BlockingNotice previous_notice_;
  void* previous_context_;
};

// Calls and clears this thread's notice, if any. Cheap when there is none.
void before_blocking();

}  // namespace c10d::core
