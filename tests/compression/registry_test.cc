// The compressor registry: every documented spec parses to the compressor it names, specs are
// canonical and round-trip, and every malformed spec is refused with a message naming the problem.
#include "compression/registry.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/common/comma_locale.h"

namespace concord {
namespace compression {
namespace {

std::string SpecOf(const std::string& text) {
  auto c = CreateCompressor(text);
  EXPECT_TRUE(c.ok()) << text << ": " << c.status().ToString();
  return c.ok() ? (*c)->spec() : "";
}

// The error message for a spec that must be refused ("" if it was accepted).
std::string ErrorOf(const std::string& text) {
  auto c = CreateCompressor(text);
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << text;
  return c.status().message();
}

TEST(RegistryTest, KnowsTheDocumentedNames) {
  EXPECT_EQ(CompressorNames(), (std::vector<std::string>{"none", "fp16", "bf16", "topk"}));
}

TEST(RegistryTest, ParsesAndCanonicalises) {
  EXPECT_EQ(SpecOf("none"), "none");
  EXPECT_EQ(SpecOf("fp16"), "fp16");
  EXPECT_EQ(SpecOf("bf16"), "bf16");
  EXPECT_EQ(SpecOf("topk:density=0.01"), "topk:density=0.01,method=sampled,values=fp32");
  EXPECT_EQ(SpecOf("topk:density=0.001,method=sampled,values=fp16"),
            "topk:density=0.001,method=sampled,values=fp16");
  EXPECT_EQ(SpecOf("topk:values=fp16,method=exact,density=1"),
            "topk:density=1,method=exact,values=fp16");
  EXPECT_EQ(SpecOf(" topk : density = 1e-3 , method = exact "),
            "topk:density=0.001,method=exact,values=fp32");
  for (const char* spec :
       {"none", "fp16", "bf16", "topk:density=0.3333333333333333,method=exact"}) {
    const std::string canonical = SpecOf(spec);
    EXPECT_EQ(SpecOf(canonical), canonical);
  }
}

TEST(RegistryTest, CreatedCompressorsHaveTheRightKind) {
  EXPECT_EQ((*CreateCompressor("fp16"))->exchange(), Exchange::kAllreduce);
  EXPECT_EQ((*CreateCompressor("fp16"))->reduce_dtype(DType::kFloat32), DType::kFloat16);
  EXPECT_EQ((*CreateCompressor("bf16"))->reduce_dtype(DType::kFloat64), DType::kBFloat16);
  EXPECT_EQ((*CreateCompressor("none"))->reduce_dtype(DType::kInt32), DType::kInt32);
  EXPECT_EQ((*CreateCompressor("topk:density=0.5"))->exchange(), Exchange::kAllgather);
  EXPECT_TRUE((*CreateCompressor("topk:density=0.5"))->uses_state());
  EXPECT_FALSE((*CreateCompressor("fp16"))->uses_state());
}

TEST(RegistryTest, RefusesUnknownNames) {
  for (const char* spec : {"", "  ", "fp8", "FP16", "topk2", ":density=0.1", "none,fp16"}) {
    const std::string error = ErrorOf(spec);
    EXPECT_NE(error.find("unknown compressor"), std::string::npos) << spec << ": " << error;
    EXPECT_NE(error.find("none, fp16, bf16, topk"), std::string::npos) << error;
  }
}

TEST(RegistryTest, RefusesBadTopkParameters) {
  EXPECT_NE(ErrorOf("topk").find("needs a density"), std::string::npos);
  EXPECT_NE(ErrorOf("topk:method=exact").find("needs a density"), std::string::npos);
  for (const char* d :
       {"0", "-0.1", "1.5", "1.0000001", "1e-400x", "abc", "", "nan", "inf", "0.01x", "1e999"}) {
    const std::string error = ErrorOf(std::string("topk:density=") + d);
    EXPECT_NE(error, "") << d;
    EXPECT_NE(error.find("density"), std::string::npos) << d << ": " << error;
  }
  // Numbers past a double's range are numbers, only not densities.
  for (const char* d : {"1e-400", "1e999", "inf"}) {
    EXPECT_NE(ErrorOf(std::string("topk:density=") + d).find("is not in (0, 1]"), std::string::npos)
        << d;
  }
  // A subnormal density is in (0, 1] (strtod says ERANGE for it too): it used to be refused.
  EXPECT_EQ(SpecOf("topk:density=1e-310"), "topk:density=1e-310,method=sampled,values=fp32");
  EXPECT_EQ(SpecOf("topk:density=4.9e-324"), "topk:density=5e-324,method=sampled,values=fp32");
  EXPECT_NE(ErrorOf("topk:density=0.01,method=fast").find("method 'fast'"), std::string::npos);
  EXPECT_NE(ErrorOf("topk:density=0.01,values=int8").find("values 'int8'"), std::string::npos);
  EXPECT_NE(ErrorOf("topk:density=0.01,ratio=2").find("unknown parameter 'ratio'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("topk:density=0.01,density=0.1").find("given twice"), std::string::npos);
  EXPECT_NE(ErrorOf("topk:density").find("key=value"), std::string::npos);
  EXPECT_NE(ErrorOf("topk:density=0.01,").find("key=value"), std::string::npos);
  EXPECT_NE(ErrorOf("topk:").find("key=value"), std::string::npos);
  EXPECT_NE(ErrorOf("topk:=0.1").find("key=value"), std::string::npos);
}

// An application may set a locale whose numbers have a decimal comma (de_DE, fr_FR, ...): specs
// still read and write "0.001". It used to refuse "topk:density=0.001" ("is not a number") and
// would have written "density=0,001", which the spec grammar splits at the comma.
TEST(RegistryTest, NumbersUseTheCLocaleWhateverTheApplicationSet) {
  const harness::CommaLocale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why();
  EXPECT_EQ(SpecOf("topk:density=0.001,method=exact"),
            "topk:density=0.001,method=exact,values=fp32");
  EXPECT_EQ(SpecOf("topk:density=0.25"), "topk:density=0.25,method=sampled,values=fp32");
  EXPECT_NE(ErrorOf("topk:density=0,5").find("key=value"), std::string::npos);
  EXPECT_NE(ErrorOf("topk:density=1.5").find("(0, 1]"), std::string::npos);
}

TEST(RegistryTest, RefusesParametersOnParameterlessCompressors) {
  for (const char* spec : {"none:x=1", "fp16:density=0.1", "bf16:scale=2"}) {
    EXPECT_NE(ErrorOf(spec).find("takes no parameters"), std::string::npos) << spec;
  }
  EXPECT_NE(ErrorOf("fp16:").find("key=value"), std::string::npos);
}

}  // namespace
}  // namespace compression
}  // namespace concord
