// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).
// Built with clang and -Wthread-safety, the compiler checks that a member marked GUARDED_BY(mu)
// is touched only while `mu` is held, that a function marked REQUIRES(mu) is called with it held,
// and (with -Wthread-safety-beta) that locks are taken in the declared order (ACQUIRED_BEFORE).
// Other compilers see nothing. Use them with base/mutex.h's Mutex, which carries the capability;
// std::mutex in libstdc++ does not.
#pragma once

#if defined(__clang__)
#define CONCORD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define CONCORD_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) CONCORD_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY CONCORD_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) CONCORD_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) CONCORD_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) CONCORD_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) CONCORD_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) CONCORD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) CONCORD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) CONCORD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) CONCORD_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) CONCORD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) CONCORD_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) CONCORD_THREAD_ANNOTATION(lock_returned(x))
// For the few functions whose locking the analysis cannot follow; each use says why.
#define NO_THREAD_SAFETY_ANALYSIS CONCORD_THREAD_ANNOTATION(no_thread_safety_analysis)
