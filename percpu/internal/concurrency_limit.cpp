// The concurrency limit (concurrency_limit.hpp).

#include "percpu/internal/concurrency_limit.hpp"

namespace percpu {
namespace internal {

concurrency_limit_line g_concurrency_limit{0};

void raise_concurrency_limit(std::uint32_t id) noexcept {
  std::uint32_t seen = __atomic_load_n(&g_concurrency_limit.limit, __ATOMIC_RELAXED);
  // A sequentially consistent exchange: whoever writes at `id` after this
  // returns has the raise before its write in its own order, which is what
  // a reader that synchronises with that write relies on.
  while (seen <= id && !__atomic_compare_exchange_n(&g_concurrency_limit.limit, &seen, id + 1, true,
                                                    __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
  }
}

}  // namespace internal
}  // namespace percpu
