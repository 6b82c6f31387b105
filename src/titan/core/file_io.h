// Writing files so that a failure is reported and leaves nothing half-written: every write, fsync
// and close is checked, errors are titan::Error lines naming the file and the system's reason
// ("No space left on device"), and a file appears under its name only once it is complete.
//
// Temporary names are NAME.tmp-PID (and, for checkpoint directories, .old-PID / .del-PID): a run
// killed before its rename leaves one behind, and the next run removes those whose PID no longer
// runs (remove_stale_temps).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace titan::io {

// strerror-like text for errno e.
std::string errno_message(int e);

// path made absolute against the working directory, normalized ("a/../b" -> "b"): the path a
// log line names for a file the user gave relative.
std::string absolute_path(const std::string& path);

// path + ".tmp-<pid of this process>".
std::string temp_name(const std::string& path);

// Writes data to path through temp_name(path): write, fsync, close, rename. On any failure the
// temporary file is removed and titan::Error names path and the reason; an earlier file at path
// is then untouched. A special file (is_special_file: /dev/null, a FIFO) is written directly.
// kill_point: a test hook reached between the fsync and the rename.
void write_file_atomic(const std::string& path, std::string_view data,
                       const char* kill_point = nullptr);
// The same for data given in pieces, written one after the other.
void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> pieces,
                       const char* kill_point = nullptr);

// Whether path exists and is neither a regular file nor a directory (a device such as /dev/null,
// a FIFO, /dev/stdout): the writers above write such a path directly, never replacing it.
bool is_special_file(const std::string& path);

// Reading. Every file titan reads is checked first (stat only: nothing is opened, so nothing
// blocks): a FIFO, a device, a socket or a directory where a file is expected is refused with
// titan::Error "<what> <path> is a FIFO, not a regular file ...". A path that does not exist
// passes (the reader names it as missing).
void check_input_file(const std::string& path, const std::string& what);

// Whether a and b name the same existing file (device and inode, whatever the path text:
// links, "./", symbolic links). An output that is one of the inputs is refused with this.
bool same_file(const std::string& a, const std::string& b);
// Throws titan::Error "<what_out> <out> is <what_in> <in>: writing it would destroy it" when
// they are the same file.
void check_not_input(const std::string& out, const std::string& what_out, const std::string& in,
                     const std::string& what_in);

// Makes renames inside dir durable (fsync of the directory). Best effort.
void fsync_dir(const std::string& dir);

// Whether process pid exists (kill(pid, 0); a process of another user counts as alive, a zombie
// as dead).
bool pid_alive(int64_t pid);
// Whether the process that made `path` (a NAME.KIND-PID temporary) may still be running: pid is
// alive and started no later than path was last modified. A PID reused by a process started
// after the writer died does not keep its leftovers.
bool owner_alive(int64_t pid, const std::string& path);
// Renames `from` to `to` (a NAME.KIND-PID temporary of this process: a step folder set aside)
// and marks `to` modified now, so that owner_alive counts it as this process's, not as an old
// leftover of a reused PID (a rename keeps the modification time). Throws titan::Error naming
// both paths when the rename fails.
void rename_aside(const std::string& from, const std::string& to);

// Splits "BASE.KIND-PID" (KIND: tmp, old or del; PID all digits). False for other names.
bool parse_temp_name(const std::string& name, std::string* base, std::string* kind, int64_t* pid);

// Removes dir/NAME.tmp-PID (file or directory) left by a killed run whose PID no longer runs, for
// each such name. Returns how many were removed; failures to remove are ignored.
int remove_stale_temps(const std::string& dir, const std::string& name);

// An exclusive lock on a folder for one process (flock on dir/.titan.lock, which holds the
// holder's PID), held until destroyed. Taking it creates the folder; when another process holds
// it, throws titan::Error "<what> <dir> is in use by another titan run (PID n) ...". A folder it
// created and that holds nothing but the lock file when released is removed.
class DirLock {
 public:
  DirLock() = default;
  DirLock(const std::string& dir, const std::string& what);
  DirLock(DirLock&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)),
        dir_(std::move(o.dir_)),
        created_(std::exchange(o.created_, false)) {}
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();

 private:
  void release();
  int fd_ = -1;
  std::string dir_;
  bool created_ = false;
};

// A file appended to record by record (metrics.jsonl): each append() writes the whole record or,
// on failure, truncates the file back to where it was (removing it if this object created it)
// and throws titan::Error naming the file.
class AppendFile {
 public:
  AppendFile() = default;
  // Opens (creating) path for appending; throws titan::Error naming it on failure.
  explicit AppendFile(const std::string& path);
  AppendFile(AppendFile&& o) noexcept;
  AppendFile& operator=(AppendFile&& o) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // what: the record, for the message ("the metrics record for step 3").
  void append(std::string_view data, const std::string& what);
  // Closes, checking the result; throws titan::Error naming the file.
  void close();

 private:
  std::string path_;
  int fd_ = -1;
  bool created_ = false;
  int64_t size_ = 0;
};

}  // namespace titan::io
