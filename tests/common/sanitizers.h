// Whether a sanitizer's allocator runs in this program (AddressSanitizer or ThreadSanitizer): it
// aborts where operator new would throw std::bad_alloc, so the tests of out-of-memory paths skip
// there (if (harness::kSanitized) GTEST_SKIP() << harness::kSanitizedWhy;).
#pragma once

namespace concord {
namespace harness {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

constexpr char kSanitizedWhy[] =
    "the sanitizers' operator new aborts instead of throwing "
    "std::bad_alloc";

}  // namespace harness
}  // namespace concord
