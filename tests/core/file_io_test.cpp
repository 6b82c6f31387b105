// Leftover temporaries of killed runs (core/file_io.h): a NAME.tmp-PID is removed when its PID no
// longer runs, or runs but is a younger process that reused the PID after the writer died.
#include "titan/core/file_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "test_util.h"
#include "titan/core/error.h"

namespace titan::io {
namespace {
namespace fs = std::filesystem;

TEST(FileIo, TempOfAReusedPidIsStaleButOneOfTheLiveWriterIsKept) {
  const std::string dir = titan::testing::fresh_temp_dir("reused_pid");
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // a live process that plays the one that now has the PID
    ::pause();
    _exit(0);
  }
  const std::string old = dir + "/data.bin.tmp-" + std::to_string(child);
  std::ofstream(old) << "left by a run killed an hour ago";
  // Last written an hour before the child started: its writer was another process.
  struct timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= 3600;
  times[1] = times[0];
  ASSERT_EQ(utimensat(AT_FDCWD, old.c_str(), times, 0), 0);
  EXPECT_TRUE(pid_alive(child));
  EXPECT_FALSE(owner_alive(child, old));
  EXPECT_EQ(remove_stale_temps(dir, "data.bin"), 1);
  EXPECT_FALSE(fs::exists(old));

  // Written now, by (as far as the file can tell) the live child: kept.
  const std::string fresh = dir + "/data.bin.tmp-" + std::to_string(child);
  std::ofstream(fresh) << "being written";
  EXPECT_TRUE(owner_alive(child, fresh));
  EXPECT_EQ(remove_stale_temps(dir, "data.bin"), 0);
  EXPECT_TRUE(fs::exists(fresh));

  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(owner_alive(child, fresh));  // gone (and reaped)
}

// A step folder last written an hour ago, set aside as NAME.old-PID by a live writer (the
// two-rename replacement), belongs to that writer: a rename keeps the modification time, so
// rename_aside marks it now and owner_alive keeps it from another run's clean-up.
TEST(FileIo, FolderSetAsideByALiveWriterIsItsEvenIfOld) {
  const std::string dir = titan::testing::fresh_temp_dir("set_aside");
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the live writer
    ::pause();
    _exit(0);
  }
  const std::string step = dir + "/step-4", old = step + ".old-" + std::to_string(child);
  fs::create_directories(step);
  struct timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= 3600;
  times[1] = times[0];
  ASSERT_EQ(utimensat(AT_FDCWD, step.c_str(), times, 0), 0);
  EXPECT_FALSE(owner_alive(child, step));  // as old as it looks
  rename_aside(step, old);
  EXPECT_TRUE(owner_alive(child, old));
  EXPECT_THROW(rename_aside(step, old), Error);  // gone: one line naming both
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

// `--output /dev/null` once renamed a regular file over the machine's /dev/null. A character
// device (a private copy of /dev/null's, made here) is written through and stays a device.
TEST(FileIo, SpecialFilesAreWrittenThroughNotReplaced) {
  const std::string dir = testing::fresh_temp_dir("special_file");
  const std::string dev = dir + "/null";
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
    GTEST_SKIP() << "cannot make a device node here (needs root)";
  EXPECT_TRUE(is_special_file(dev));
  EXPECT_FALSE(is_special_file(dir));
  write_file_atomic(dev, "some text");
  struct stat st;
  ASSERT_EQ(::stat(dev.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), "null") << "a temporary was left";
}

}  // namespace
}  // namespace titan::io
