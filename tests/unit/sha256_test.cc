// tests/common/sha256.h against FIPS 180-4's known answers (and the NIST long messages), whole
// and fed in uneven pieces: the digest tests/mp/determinism.cc compares results by.
#include "tests/common/sha256.h"

#include <gtest/gtest.h>

#include <string>

namespace concord::harness {
namespace {

std::string HexOf(const std::string& message) {
  return Sha256::Hex(Sha256::Of(message.data(), message.size()));
}

TEST(Sha256Test, KnownAnswers) {
  EXPECT_EQ(HexOf(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(HexOf("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(HexOf("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(HexOf(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // 55, 56 and 64 bytes: the padding's edge cases (one block, two blocks).
  EXPECT_EQ(HexOf(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(HexOf(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(HexOf(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256Test, PiecesGiveTheWholeMessagesDigest) {
  std::string message;
  for (int i = 0; i < 1000; ++i) message += static_cast<char>(i * 7 + 3);
  const Sha256::Digest whole = Sha256::Of(message.data(), message.size());
  for (size_t piece : {1, 3, 63, 64, 65, 200}) {
    Sha256 s;
    for (size_t at = 0; at < message.size(); at += piece) {
      s.Update(message.data() + at, std::min(piece, message.size() - at));
    }
    s.Update(nullptr, 0);
    EXPECT_EQ(s.Finish(), whole) << "pieces of " << piece;
  }
  EXPECT_NE(Sha256::Of("abd", 3), Sha256::Of("abc", 3));
}

}  // namespace
}  // namespace concord::harness
