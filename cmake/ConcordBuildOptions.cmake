# Compiler and linker flags for Concord's own targets: warnings, CONCORD_WERROR, CONCORD_SANITIZE
# and CONCORD_THREAD_SAFETY_ANALYSIS (the options are declared in the top-level CMakeLists.txt).
# They live on one INTERFACE library, concord_build_options, that every target Concord defines
# links PRIVATE (concord_use_build_options, called once after every directory is added). Nothing
# is set with add_compile_options or add_link_options, so a framework that adds Concord with
# add_subdirectory keeps its own flags, and Concord's never reach the framework's targets.

add_library(concord_build_options INTERFACE)
# At least C++17; a parent that builds everything as C++20 builds Concord as C++20.
target_compile_features(concord_build_options INTERFACE cxx_std_17)
# nvcc hands the warning flags to its host compiler. Its own front end (diagnostic 2810) also
# warns when the Status& that an assignment `s = Status(...)` returns is ignored, as if it were a
# [[nodiscard]] Status; gcc and clang rightly do not (a discarded Status is still caught there).
target_compile_options(concord_build_options INTERFACE
  "$<$<COMPILE_LANGUAGE:C,CXX>:-Wall;-Wextra>"
  "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra;-diag-suppress=2810>")
if(CONCORD_WERROR)
  target_compile_options(concord_build_options INTERFACE
    "$<$<COMPILE_LANGUAGE:C,CXX>:-Werror>"
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>")
endif()

# Clang checks base/thread_annotations.h's annotations (GUARDED_BY, REQUIRES, ...); other
# compilers ignore them, so the option needs clang.
if(CONCORD_THREAD_SAFETY_ANALYSIS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CONCORD_THREAD_SAFETY_ANALYSIS needs clang (-DCMAKE_CXX_COMPILER=clang++), "
                        "not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  # -beta adds the lock-order checks (ACQUIRED_BEFORE/ACQUIRED_AFTER).
  target_compile_options(concord_build_options INTERFACE
    "$<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety;-Wthread-safety-beta>")
endif()

# CONCORD_SANITIZE: a comma list of address, undefined and thread; ON (the option's old boolean
# form, still passed by older scripts) means address,undefined; OFF or empty means none.
string(TOLOWER "${CONCORD_SANITIZE}" concord_sanitize)
if(concord_sanitize MATCHES "^(on|yes|true|1)$")
  set(concord_sanitize "address,undefined")
elseif(concord_sanitize MATCHES "^(off|no|false|0|)$")
  set(concord_sanitize "")
endif()
# CONCORD_FUZZ (tests/fuzz) fuzzes under address,undefined unless other sanitizers are named.
if(CONCORD_FUZZ AND concord_sanitize STREQUAL "")
  set(concord_sanitize "address,undefined")
endif()
string(REPLACE "," ";" CONCORD_SANITIZERS "${concord_sanitize}")
foreach(sanitizer IN LISTS CONCORD_SANITIZERS)
  if(NOT sanitizer MATCHES "^(address|undefined|thread)$")
    message(FATAL_ERROR "CONCORD_SANITIZE: unknown sanitizer '${sanitizer}' in "
                        "'${CONCORD_SANITIZE}' (address, undefined, thread, or a comma list)")
  endif()
endforeach()
if("address" IN_LIST CONCORD_SANITIZERS AND "thread" IN_LIST CONCORD_SANITIZERS)
  message(FATAL_ERROR "CONCORD_SANITIZE=${CONCORD_SANITIZE}: ThreadSanitizer cannot be combined "
                      "with AddressSanitizer (their shadow memories overlap; compilers refuse the "
                      "pair): build them separately")
endif()
if(CONCORD_SANITIZERS)
  message(STATUS "Concord sanitizers: ${concord_sanitize}")
  # Frame pointers give the sanitizers' reports whole stacks; a sanitizer error ends the program,
  # so that ctest sees it.
  target_compile_options(concord_build_options INTERFACE
    "$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${concord_sanitize};-fno-omit-frame-pointer>")
  if("undefined" IN_LIST CONCORD_SANITIZERS)
    target_compile_options(concord_build_options INTERFACE
      "$<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=undefined>")
    # CONCORD_UBSAN_TESTS=OFF: the gtest binaries' own code (target property CONCORD_TEST_CODE,
    # set by tests/' concord_gtest_binary) is not instrumented; after -fsanitize, so it wins.
    if(NOT CONCORD_UBSAN_TESTS)
      target_compile_options(concord_build_options INTERFACE
        "$<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:$<TARGET_PROPERTY:CONCORD_TEST_CODE>>>:-fno-sanitize=undefined>")
    endif()
  endif()
  target_link_options(concord_build_options INTERFACE -fsanitize=${concord_sanitize})
  # libstdc++'s own checks end the program too (an empty std::optional dereferenced, operator[]
  # out of range): undefined behaviour that a plain build lets pass fails a sanitizer run.
  target_compile_definitions(concord_build_options INTERFACE
    "$<$<COMPILE_LANGUAGE:CXX>:_GLIBCXX_ASSERTIONS>")
endif()

# CONCORD_TEST_CODE_FLAGS: the gtest binaries' own code (target property CONCORD_TEST_CODE) gets
# these flags after the build type's, so that they win (scripts/test.sh passes -Og: test code
# compiles 1.7-2x as fast as at -O2, while the library it tests keeps the build type's -O2).
if(CONCORD_TEST_CODE_FLAGS)
  separate_arguments(concord_test_code_flags UNIX_COMMAND "${CONCORD_TEST_CODE_FLAGS}")
  target_compile_options(concord_build_options INTERFACE
    "$<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:$<TARGET_PROPERTY:CONCORD_TEST_CODE>>>:${concord_test_code_flags}>")
endif()

# CONCORD_FUZZ: libFuzzer's coverage instrumentation on every Concord target, so that the fuzz
# targets (which link the layers' libraries) are guided by the code they drive, not only their own.
if(CONCORD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "CONCORD_FUZZ needs clang (libFuzzer): -DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang")
  endif()
  target_compile_options(concord_build_options INTERFACE
    "$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
  target_link_options(concord_build_options INTERFACE -fsanitize=fuzzer-no-link)
endif()

# concord_use_build_options(DIR): links concord_build_options PRIVATE into every library and
# executable defined in DIR and the directories below it. Run once over the project's root, it
# covers every target, including those that test and tool directories add later.
function(concord_use_build_options dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
      target_link_libraries(${target} PRIVATE concord_build_options)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    concord_use_build_options(${subdir})
  endforeach()
endfunction()
