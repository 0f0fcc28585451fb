// The fork registry of percpu/internal/fork_registry.hpp.

#include "percpu/internal/fork_registry.hpp"

#include <pthread.h>

#include "percpu/internal/cpu_slots.hpp"

namespace percpu {
namespace internal {

// The fork registry: a list of participants behind a mutex, and one set of
// pthread_atfork handlers that walk it.
struct fork_registry {
  static pthread_mutex_t mutex;
  static fork_participant* first;

  static void prepare() noexcept {
    pthread_mutex_lock(&mutex);
    begin_fork_flags();
    for (fork_participant* p = first; p != nullptr; p = p->next_) p->before_fork();
  }
  static void release(bool child) noexcept {
    for (fork_participant* p = first; p != nullptr; p = p->next_) p->after_fork(child);
    end_fork_flags();
    pthread_mutex_unlock(&mutex);
  }
  static void release_in_parent() noexcept { release(false); }
  static void release_in_child() noexcept { release(true); }
  static void install() noexcept {
    static const bool installed = [] {
      pthread_atfork(&fork_registry::prepare, &fork_registry::release_in_parent,
                     &fork_registry::release_in_child);
      return true;
    }();
    (void)installed;
  }
};

pthread_mutex_t fork_registry::mutex = PTHREAD_MUTEX_INITIALIZER;
fork_participant* fork_registry::first = nullptr;

void fork_participant::register_for_fork() noexcept {
  fork_registry::install();
  pthread_mutex_lock(&fork_registry::mutex);
  next_ = fork_registry::first;
  prev_ = nullptr;
  if (next_ != nullptr) next_->prev_ = this;
  fork_registry::first = this;
  pthread_mutex_unlock(&fork_registry::mutex);
}

void fork_participant::unregister_for_fork() noexcept {
  pthread_mutex_lock(&fork_registry::mutex);
  if (prev_ != nullptr) {
    prev_->next_ = next_;
  } else {
    fork_registry::first = next_;
  }
  if (next_ != nullptr) next_->prev_ = prev_;
  prev_ = next_ = nullptr;
  pthread_mutex_unlock(&fork_registry::mutex);
}

}  // namespace internal
}  // namespace percpu
