// ReadSecretFile (common/secret_file.h): the one check of a secret file's permissions. Owner-only
// files are read unchanged; group/other permission bits, non-regular files, oversized files and
// missing files are refused naming the file (and the mode and the fix), before a byte is read.
#include "common/secret_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>

#include "fmt/format.h"
#include "tests/harness/child_process.h"
#include "tests/unit/test_util.h"

namespace bitpush {
namespace {

class SecretFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text, mode_t mode) {
    const std::string p = dir_.path() + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    EXPECT_EQ(chmod(p.c_str(), mode), 0) << p;
    return p;
  }

  testing::TempDir dir_{"bp-secret"};
};

TEST_F(SecretFileTest, OwnerOnlyFilesAreReadUnchanged) {
  for (const mode_t mode : {0600, 0400, 0700}) {
    const std::string p = Write(fmt::format("key-{:o}", mode), "  a secret\n\n", mode);
    StatusOr<std::string> s = ReadSecretFile(p, "test secret");
    ASSERT_TRUE(s.ok()) << std::oct << mode << ": " << s.status().ToString();
    EXPECT_EQ(*s, "  a secret\n\n");  // no trimming: the caller decides
  }
  StatusOr<std::string> empty = ReadSecretFile(Write("empty", "", 0600), "test secret");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(*empty, "");
}

TEST_F(SecretFileTest, GroupOrOtherBitsAreRefusedNamingFileModeAndFix) {
  // Every single group/other bit is enough, read or not.
  for (const mode_t extra : {040, 020, 010, 004, 002, 001, 077}) {
    const mode_t mode = 0600 | extra;
    const std::string p = Write(fmt::format("key-{:o}", mode), "top secret", mode);
    StatusOr<std::string> s = ReadSecretFile(p, "CURVE secret key");
    ASSERT_FALSE(s.ok()) << std::oct << mode;
    EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
    const std::string m = s.status().message();
    EXPECT_CONTAINS(m, "CURVE secret key " + p);
    EXPECT_CONTAINS(m, fmt::format("has mode {:04o}", mode));
    EXPECT_CONTAINS(m, "chmod 600 " + p);
    EXPECT_EQ(m.find("top secret"), std::string::npos) << m;
  }
}

TEST_F(SecretFileTest, ALinkIsJudgedByTheFileItLeadsTo) {
  const std::string good = Write("good", "s", 0600);
  const std::string bad = Write("bad", "s", 0644);
  const std::string to_good = dir_.path() + "/to-good";
  const std::string to_bad = dir_.path() + "/to-bad";
  ASSERT_EQ(symlink(good.c_str(), to_good.c_str()), 0);
  ASSERT_EQ(symlink(bad.c_str(), to_bad.c_str()), 0);
  StatusOr<std::string> s = ReadSecretFile(to_good, "token file");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, "s");
  s = ReadSecretFile(to_bad, "token file");
  ASSERT_FALSE(s.ok());
  EXPECT_CONTAINS(s.status().message(), "has mode 0644");
  EXPECT_CONTAINS(s.status().message(), to_bad);
}

TEST_F(SecretFileTest, MissingDirectoryFifoAndOversizedFilesAreRefused) {
  StatusOr<std::string> s = ReadSecretFile(dir_.path() + "/missing", "token file");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(s.status().message(), dir_.path() + "/missing: cannot open: No such file");

  const std::string sub = dir_.path() + "/sub";
  ASSERT_EQ(mkdir(sub.c_str(), 0700), 0);
  s = ReadSecretFile(sub, "token file");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.status().message(), "not a regular file");

  // A FIFO with no writer: refused at once, never a blocked open or read.
  const std::string fifo = dir_.path() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  s = ReadSecretFile(fifo, "token file");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_FALSE(s.ok());
  EXPECT_CONTAINS(s.status().message(), "not a regular file");

  const std::string big = Write("big", std::string(kMaxSecretFileBytes + 1, 'x'), 0600);
  s = ReadSecretFile(big, "token file");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.status().message(), big);
  EXPECT_TRUE(ReadSecretFile(Write("max", std::string(kMaxSecretFileBytes, 'x'), 0600), "t").ok());
}

}  // namespace
}  // namespace bitpush
