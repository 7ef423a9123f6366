// src/aot/bundle_file.cpp: bounded, non-blocking reads of a bundle's regular files
#include "aot/bundle_file.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "aot/bundle_rules.h"

namespace luminav {

namespace {

constexpr const char* kFix = "rebuild the bundle (luminamoon aot build) or copy it again";

[[noreturn]] void refuse(BundleRule rule, const std::string& path, const std::string& field,
                         const std::string& expected, const std::string& found) {
  throw BundleError(rule, path, field, expected, found,
                    printable(path, 4096) + ": " + field + ": expected " + expected + ", found " + found + "; " + kFix);
}

std::string real_path(const std::string& path, int& err) {
  std::unique_ptr<char, decltype(&::free)> p(::realpath(path.c_str(), nullptr), &::free);
  err = p ? 0 : errno;
  return p ? std::string(p.get()) : std::string();
}

bool inside(const std::string& path, const std::string& folder) {
  if (path == folder) return true;
  const std::string prefix = folder.size() > 0 && folder.back() == '/' ? folder : folder + "/";
  return path.compare(0, prefix.size(), prefix) == 0;
}

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

void check_mode(const struct stat& st, const std::string& path, const std::string& field, std::uint64_t limit) {
  if (!S_ISREG(st.st_mode)) refuse(BundleRule::kNotRegularFile, path, field, "a regular file", kind_of(st.st_mode));
  if (static_cast<std::uint64_t>(st.st_size) > limit) {
    refuse(BundleRule::kTooLarge, path, field, "at most " + std::to_string(limit) + " bytes",
           std::to_string(st.st_size) + " bytes");
  }
}

// The rule book's file checks up to the open: returns the size stat() reports.
std::uint64_t check_path(const std::string& dir, const std::string& path, const std::string& field,
                         std::uint64_t limit) {
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) refuse(BundleRule::kMissingFile, path, field, "a file", "no such file");
    refuse(BundleRule::kUnreadable, path, field, "a readable file", std::strerror(err));
  }
  if (S_ISLNK(lst.st_mode)) {
    int err = 0;
    const std::string real = real_path(path, err);
    if (real.empty()) {
      if (err == ENOENT) refuse(BundleRule::kMissingFile, path, field, "a file", "a symbolic link to nothing");
      refuse(BundleRule::kUnreadable, path, field, "a readable file",
             std::string("a symbolic link that cannot be resolved (") + std::strerror(err) + ")");
    }
    const std::string real_dir = real_path(dir.empty() ? "." : dir, err);
    if (real_dir.empty() || !inside(real, real_dir)) {
      refuse(BundleRule::kNotRegularFile, path, field, "a regular file inside the bundle folder",
             "a symbolic link to '" + printable(real, 4096) + "', outside it");
    }
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) refuse(BundleRule::kMissingFile, path, field, "a file", "no such file");
    refuse(BundleRule::kUnreadable, path, field, "a readable file", std::strerror(err));
  }
  check_mode(st, path, field, limit);
  return static_cast<std::uint64_t>(st.st_size);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string bundle_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::uint64_t stat_bundle_file(const std::string& dir, const std::string& name, std::uint64_t limit,
                               const std::string& field) {
  return check_path(dir, bundle_path(dir, name), field, limit);
}

std::vector<unsigned char> read_bundle_file(const std::string& dir, const std::string& name, std::uint64_t limit,
                                            const std::string& field) {
  const std::string path = bundle_path(dir, name);
  check_path(dir, path, field, limit);
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENOENT) refuse(BundleRule::kMissingFile, path, field, "a file", "no such file");
    refuse(BundleRule::kUnreadable, path, field, "a readable file", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) refuse(BundleRule::kUnreadable, path, field, "a readable file", std::strerror(errno));
  check_mode(st, path, field, limit);  // the file opened is the file checked
  std::vector<unsigned char> out(static_cast<std::size_t>(st.st_size));
  std::size_t used = 0;
  for (;;) {
    if (used == out.size()) {
      if (out.size() > limit) {
        refuse(BundleRule::kTooLarge, path, field, "at most " + std::to_string(limit) + " bytes",
               "more than " + std::to_string(limit) + " bytes (the file grew while read)");
      }
      // Room for one more chunk, never past limit + 1 bytes: a file that grows is cut there.
      const std::uint64_t room = std::min<std::uint64_t>(limit + 1, out.size() + (std::uint64_t{1} << 16));
      out.resize(static_cast<std::size_t>(room));
    }
    const ssize_t got = ::read(f.fd, out.data() + used, out.size() - used);
    if (got < 0) {
      if (errno == EINTR) continue;
      refuse(BundleRule::kUnreadable, path, field, "a readable file", std::strerror(errno));
    }
    if (got == 0) break;
    used += static_cast<std::size_t>(got);
  }
  out.resize(used);
  if (used > limit) {
    refuse(BundleRule::kTooLarge, path, field, "at most " + std::to_string(limit) + " bytes",
           "more than " + std::to_string(limit) + " bytes (the file grew while read)");
  }
  return out;
}

}  // namespace luminav
