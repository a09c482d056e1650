#include "c10d/core/blocking.h"

namespace c10d::core {
namespace {
thread_local BlockingNotice t_notice = nullptr;
thread_local void* t_context = nullptr;
}  // namespace

BlockingNoticeScope::BlockingNoticeScope(BlockingNotice notice, void* context)
    : previous_notice_(t_notice), previous_context_(t_context) {
  t_notice = notice;
  t_context = context;
}

BlockingNoticeScope::~BlockingNoticeScope() {
  t_notice = previous_notice_;
  t_context = previous_context_;
}

void before_blocking() {
  if (t_notice == nullptr) return;
  const BlockingNotice notice = t_notice;
  t_notice = nullptr;
  notice(t_context);
}

}  // namespace c10d::core
