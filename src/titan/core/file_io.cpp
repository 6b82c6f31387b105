#include "titan/core/file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>
#include <utility>

#include "titan/core/error.h"
#include "titan/core/test_hooks.h"

namespace titan::io {

std::string absolute_path(const std::string& path) {
  return std::filesystem::absolute(path).lexically_normal().string();
}
namespace fs = std::filesystem;

std::string errno_message(int e) { return std::error_code(e, std::generic_category()).message(); }

std::string temp_name(const std::string& path) {
  return path + ".tmp-" + std::to_string(static_cast<long>(::getpid()));
}

namespace {

// Writes all of data to fd; returns 0 or the errno of the failure.
int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view data, const char* kill_point) {
  write_file_atomic(path, {data}, kill_point);
}

bool is_special_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

void check_input_file(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "a special file";
  throw Error(what + " " + path + " is " + kind +
              ", not a regular file; give a file (reading it could block or never end)");
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

void check_not_input(const std::string& out, const std::string& what_out, const std::string& in,
                     const std::string& what_in) {
  check(!same_file(out, in), what_out + " " + out + " is " + what_in + " " + in +
                                 ": writing it would destroy it; give another " + what_out);
}

DirLock::DirLock(const std::string& dir, const std::string& what) : dir_(dir) {
  std::error_code ec;
  created_ = std::filesystem::create_directories(dir, ec);
  check(!ec, "cannot create " + what + " " + dir + " (" + ec.message() + ")");
  const std::string path = (std::filesystem::path(dir) / ".titan.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  const int e = errno;
  check(fd_ >= 0, "cannot open " + path + " to lock the " + what + " (" + errno_message(e) + ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int le = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    check(le == EWOULDBLOCK, "cannot lock " + path + " (" + errno_message(le) + ")");
    const std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
    throw Error(what + " " + dir + " is in use by another titan run (PID " +
                pid.substr(0, pid.find_first_of("\n ")) +
                "): two runs in one folder would mix their metrics and checkpoints; wait for it "
                "to end or give another --" +
                what);
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  const bool noted = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) > 0;
  (void)noted;  // the PID is for the message only; the lock is what counts
}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
    dir_ = std::move(o.dir_);
    created_ = std::exchange(o.created_, false);
  }
  return *this;
}

DirLock::~DirLock() { release(); }

void DirLock::release() {
  if (fd_ < 0) return;
  // A folder this lock created that holds nothing else (the run failed before writing): removed,
  // lock file and all, so that a failed start leaves nothing behind. Otherwise the lock file
  // stays (removing a lock file another process may be opening would let two runs lock).
  std::error_code ec;
  const std::filesystem::path lock = std::filesystem::path(dir_) / ".titan.lock";
  if (created_) {
    auto it = std::filesystem::directory_iterator(dir_, ec);
    bool only_lock = !ec;
    for (; only_lock && it != std::filesystem::directory_iterator(); it.increment(ec))
      only_lock = !ec && it->path().filename() == ".titan.lock";
    if (only_lock && std::filesystem::remove(lock, ec)) std::filesystem::remove(dir_, ec);
  }
  ::close(fd_);  // releases the lock
  fd_ = -1;
}

void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> pieces,
                       const char* kill_point) {
  if (is_special_file(path)) {  // /dev/null, a FIFO: written through, never renamed over
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    int e = fd < 0 ? errno : 0;
    for (const auto& piece : pieces)
      if (e == 0) e = write_all(fd, piece.data(), piece.size());
    if (fd >= 0 && ::close(fd) != 0 && e == 0) e = errno;
    if (e != 0) throw Error(path + ": write failed (" + errno_message(e) + ")");
    return;
  }
  const std::string tmp = temp_name(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    throw Error(path + ": cannot create " + tmp + " (" + errno_message(e) + ")");
  }
  int e = 0;
  for (const auto& piece : pieces)
    if (e == 0) e = write_all(fd, piece.data(), piece.size());
  const char* what = "write failed";
  if (e == 0 && ::fsync(fd) != 0) {
    e = errno;
    what = "fsync failed";
  }
  if (::close(fd) != 0 && e == 0) {
    e = errno;
    what = "close failed";
  }
  if (e == 0 && kill_point) test::kill_point(kill_point);
  if (e == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) {
    e = errno;
    what = "cannot rename the finished temporary file into place";
  }
  if (e != 0) {
    ::unlink(tmp.c_str());
    throw Error(path + ": " + what + " (" + errno_message(e) + "); the file was not written");
  }
  fsync_dir(fs::path(path).parent_path().string());
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

bool pid_alive(int64_t pid) {
  if (pid <= 0 || pid > 0x3fffffff) return false;
  if (pid == ::getpid()) return true;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  // A zombie (killed, not yet reaped: a job ended by mpirun whose processes wait for an init
  // that reaps late) is dead: /proc/PID/stat's state, after the ")" that ends the name, is Z.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string line((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

namespace {
// When process pid started (seconds since the epoch; -1 when unknown): /proc/PID/stat's field 22
// (clock ticks after boot) plus /proc/stat's btime.
double process_start_time(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string line((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(line.substr(paren + 2));  // field 3 (state) onwards
  std::string f;
  for (int i = 3; i < 22 && fields >> f;) ++i;
  unsigned long long ticks = 0;
  if (!(fields >> ticks)) return -1;
  std::ifstream sys("/proc/stat");
  for (std::string key; sys >> key;) {
    if (key != "btime") continue;
    long long btime = 0;
    if (!(sys >> btime)) return -1;
    return static_cast<double>(btime) +
           static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }
  return -1;
}
}  // namespace

bool owner_alive(int64_t pid, const std::string& path) {
  if (!pid_alive(pid)) return false;
  if (pid == ::getpid()) return true;
  struct stat st;
  const double start = process_start_time(pid);
  if (start < 0 || ::stat(path.c_str(), &st) != 0) return true;  // cannot tell: keep it
  // btime has whole seconds: 2 s of slack before calling the process younger than the file.
  return start <= static_cast<double>(st.st_mtime) + 2.0;
}

void rename_aside(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int e = errno;
    throw Error("cannot rename " + from + " to " + to + " (" + errno_message(e) + ")");
  }
  (void)::utimensat(AT_FDCWD, to.c_str(), nullptr, 0);  // now; best effort
}

bool parse_temp_name(const std::string& name, std::string* base, std::string* kind, int64_t* pid) {
  const size_t dash = name.rfind('-');
  if (dash == std::string::npos) return false;
  const std::string digits = name.substr(dash + 1);
  if (digits.empty() || digits.size() > 10 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return false;
  const size_t dot = name.rfind('.', dash);
  if (dot == std::string::npos || dot == 0) return false;
  const std::string k = name.substr(dot + 1, dash - dot - 1);
  if (k != "tmp" && k != "old" && k != "del") return false;
  *base = name.substr(0, dot);
  *kind = k;
  *pid = std::stoll(digits);
  return true;
}

int remove_stale_temps(const std::string& dir, const std::string& name) {
  std::error_code ec;
  int removed = 0;
  for (const auto& e : fs::directory_iterator(dir.empty() ? "." : dir, ec)) {
    std::string base, kind;
    int64_t pid = 0;
    if (!parse_temp_name(e.path().filename().string(), &base, &kind, &pid)) continue;
    if (base != name || kind != "tmp" || owner_alive(pid, e.path().string())) continue;
    std::error_code rec;
    if (fs::remove_all(e.path(), rec) > 0 && !rec) ++removed;
  }
  return removed;
}

AppendFile::AppendFile(const std::string& path) : path_(path) {
  struct stat st;
  created_ = ::stat(path.c_str(), &st) != 0;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int e = errno;
    throw Error(path + ": cannot open for appending (" + errno_message(e) + ")");
  }
  if (::fstat(fd_, &st) == 0) size_ = st.st_size;
}

AppendFile::AppendFile(AppendFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      created_(o.created_),
      size_(o.size_) {}

AppendFile& AppendFile::operator=(AppendFile&& o) noexcept {
  std::swap(path_, o.path_);
  std::swap(fd_, o.fd_);
  std::swap(created_, o.created_);
  std::swap(size_, o.size_);
  return *this;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::append(std::string_view data, const std::string& what) {
  check(fd_ >= 0, path_ + ": not open");
  const int e = write_all(fd_, data.data(), data.size());
  if (e == 0) {
    size_ += static_cast<int64_t>(data.size());
    return;
  }
  // Leave the file as it was: no partial record.
  const bool remove = created_ && size_ == 0;
  (void)::ftruncate(fd_, size_);
  ::close(fd_);
  fd_ = -1;
  if (remove) ::unlink(path_.c_str());
  throw Error(path_ + ": cannot write " + what + " (" + errno_message(e) + ")");
}

void AppendFile::close() {
  if (fd_ < 0) return;
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int e = errno;
    throw Error(path_ + ": close failed (" + errno_message(e) + ")");
  }
}

}  // namespace titan::io
