// Secrets from OpenSSL's cryptographic generator (random_secret_hex), the one source of the
// job secret, a launch's token and every challenge.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "commgrid/store.hpp"

namespace commgrid::test {
namespace {

TEST(RandomSecret, IsHexOfTheAskedLengthAndNeverRepeats) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string s = random_secret_hex(32);
    ASSERT_EQ(s.size(), 64u);
    EXPECT_EQ(s.find_first_not_of("0123456789abcdef"), std::string::npos) << s;
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 1000u);
  // Every hex digit occurs: the bytes are spread, not a counter or a constant.
  const std::string long_one = random_secret_hex(4096);
  for (const char c : std::string("0123456789abcdef"))
    EXPECT_NE(long_one.find(c), std::string::npos) << c;
  EXPECT_EQ(random_secret_hex(1).size(), 2u);
}

TEST(RandomSecret, AZeroOrHugeLengthIsAnError) {
  EXPECT_THROW((void)random_secret_hex(0), InvalidValueError);
  EXPECT_THROW((void)random_secret_hex((std::size_t{1} << 20) + 1), InvalidValueError);
}

TEST(RandomSecret, TheJobSecretOfAStoreComesFromIt) {
  // Two memory stores: two different 256-bit secrets in hex.
  const auto a = make_memory_store(), b = make_memory_store();
  EXPECT_EQ(a->job_secret().size(), 64u);
  EXPECT_NE(a->job_secret(), b->job_secret());
}

}  // namespace
}  // namespace commgrid::test
