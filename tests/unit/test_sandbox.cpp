// The evaluation sandbox (evolve/verify/sandbox.h): in a forked child under the CPU policy, each thing a
// hostile kernel tries fails with EPERM and leaves nothing behind, is recorded as a violation, and
// what an honest evaluation needs (threads, reading files, writing to open descriptors, memfd
// loading) still works; the limits end a spinner and a huge write. The same actions without the
// sandbox succeed (so each probe is known to test something).
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "evolve/verify/sandbox.h"

extern char** environ;

namespace kc::evolve {
namespace {

constexpr int kNoFilter = 77;   // the child could not install the filter: the test skips

std::string scratch(const std::string& name) {
  std::string dir = ::testing::TempDir() + "kc-sandbox-" + std::to_string(getpid());
  mkdir(dir.c_str(), 0700);
  return dir + "/" + name;
}

bool exists(const std::string& p) {
  struct stat st{};
  return lstat(p.c_str(), &st) == 0;
}

// Runs body() in a forked child (sandboxed by `p` unless `sandbox` is false); its wait status.
int run_child(const std::function<int()>& body, SandboxPolicy p, bool sandbox = true) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    if (sandbox && !apply_sandbox(p)) _exit(kNoFilter);
    _exit(body());
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return st;
}

SandboxPolicy cpu_policy() { return sandbox_policy(EvolveSandbox::kCpu, /*cuda=*/false, 0); }

// 0 when the call failed with EPERM, as the filter answers.
int eperm(long rc) { return rc == -1 && errno == EPERM ? 0 : 1; }

// The body's exit code under the sandbox (skipping when there is no filter here).
#define EXPECT_SANDBOXED(body)                                                   \
  do {                                                                           \
    int st_ = run_child(body, cpu_policy());                                     \
    if (WIFEXITED(st_) && WEXITSTATUS(st_) == kNoFilter) GTEST_SKIP() << "no seccomp filter on this machine"; \
    EXPECT_TRUE(WIFEXITED(st_) && WEXITSTATUS(st_) == 0)                         \
        << "exit " << (WIFEXITED(st_) ? WEXITSTATUS(st_) : -1) << " signal " << (WIFSIGNALED(st_) ? WTERMSIG(st_) : 0); \
  } while (0)

TEST(Sandbox, WritesByPathAreDeniedAndLeaveNothing) {
  const std::string f = scratch("created"), d = scratch("dir"), keep = scratch("keep"), moved = scratch("moved");
  std::FILE* k = std::fopen(keep.c_str(), "w");
  ASSERT_NE(k, nullptr) << keep;
  std::fclose(k);
  auto hostile = [&] {
    int bad = 0;
    bad |= eperm(open(f.c_str(), O_WRONLY | O_CREAT, 0600)) << 0;
    bad |= eperm(open(f.c_str(), O_RDONLY | O_CREAT, 0600)) << 1;           // O_CREAT alone creates
    bad |= eperm(syscall(SYS_openat, AT_FDCWD, keep.c_str(), O_RDWR)) << 2;
    bad |= eperm(open(keep.c_str(), O_WRONLY | O_TRUNC)) << 3;
    bad |= eperm(mkdir(d.c_str(), 0700)) << 4;
    bad |= eperm(unlink(keep.c_str())) << 5;
    bad |= eperm(rename(keep.c_str(), moved.c_str())) << 6;
    bad |= eperm(symlink(keep.c_str(), moved.c_str())) << 7;
    bad |= eperm(chmod(keep.c_str(), 0777)) << 8;
    bad |= eperm(truncate(keep.c_str(), 0)) << 9;
    std::FILE* fp = std::fopen(f.c_str(), "w");
    bad |= (fp != nullptr) << 10;
    // Reading stays.
    int r = open(keep.c_str(), O_RDONLY);
    bad |= (r < 0) << 11;
    auto v = take_sandbox_violation();
    bad |= (!v || v->name != "openat" || v->attempts < 10) << 12;
    return bad;
  };
  EXPECT_SANDBOXED(hostile);
  EXPECT_FALSE(exists(f));
  EXPECT_FALSE(exists(d));
  EXPECT_FALSE(exists(moved));
  EXPECT_TRUE(exists(keep));
  // Without the sandbox the same probe does create the directory.
  EXPECT_EQ(run_child([&] { return mkdir(d.c_str(), 0700) == 0 ? 0 : 1; }, {}, false), 0);
  EXPECT_TRUE(exists(d));
  rmdir(d.c_str());
}

TEST(Sandbox, NoNewProcesses) {
  const std::string marker = scratch("forked");
  auto hostile = [&] {
    int bad = 0;
    // A process that would outlive the evaluation creates `marker` after its parent is gone.
    auto payload = [&] {
      sleep(1);
      close(open(marker.c_str(), O_WRONLY | O_CREAT, 0600));
      _exit(0);
    };
    pid_t p = fork();
    if (p == 0) payload();
    bad |= (p != -1 || errno != EPERM) << 0;
    p = vfork();
    if (p == 0) _exit(0);
    bad |= (p != -1) << 1;
    long c = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (c == 0) payload();
    bad |= eperm(c) << 2;
    bad |= (syscall(SYS_clone3, nullptr, 0) != -1 || errno != ENOSYS) << 3;   // glibc falls back to clone
    char sh[] = "/bin/sh";
    char* argv[] = {sh, nullptr};
    bad |= eperm(execve(sh, argv, environ)) << 4;
    bad |= eperm(setsid()) << 5;
    // Threads still work: the kernel's parallel_for runs on them.
    int ran = 0;
    std::thread t([&] { ran = 1; });
    t.join();
    bad |= (ran != 1) << 6;
    return bad;
  };
  EXPECT_SANDBOXED(hostile);
  sleep(2);
  EXPECT_FALSE(exists(marker)) << "a forked process ran";
}

// posix_spawn and system() block every signal around their clone, so the denied call cannot be
// answered through the SIGSYS handler: the kernel ends the process with SIGSYS instead (a crash
// verdict for a candidate). Either way nothing runs.
TEST(Sandbox, SpawnAndSystemFailOrEndTheProcess) {
  const std::string m1 = scratch("spawned"), m2 = scratch("system");
  for (const std::string& marker : {m1, m2}) {
    auto hostile = [&] {
      std::string cmd = "touch " + marker;
      if (&marker == &m2) return std::system(cmd.c_str()) == 0 ? 1 : 0;
      char sh[] = "/bin/sh", c[] = "-c";
      char* argv[] = {sh, c, cmd.data(), nullptr};
      pid_t pid = 0;
      if (posix_spawn(&pid, sh, nullptr, nullptr, argv, environ) != 0) return 0;
      int st = 0;
      waitpid(pid, &st, 0);
      return 1;
    };
    const int st = run_child(hostile, cpu_policy());
    if (WIFEXITED(st) && WEXITSTATUS(st) == kNoFilter) GTEST_SKIP() << "no seccomp filter on this machine";
    EXPECT_TRUE((WIFEXITED(st) && WEXITSTATUS(st) == 0) || (WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS)) << marker;
    EXPECT_FALSE(exists(marker));
  }
  // Unsandboxed, the same probe runs its command.
  EXPECT_EQ(run_child([&] { return std::system(("touch " + m2).c_str()) == 0 ? 0 : 1; }, {}, false), 0);
  EXPECT_TRUE(exists(m2));
  unlink(m2.c_str());
}

TEST(Sandbox, NoNetworkNoSignalsToOthersNoLimitChanges) {
  auto hostile = [&] {
    int bad = 0;
    bad |= eperm(socket(AF_INET, SOCK_STREAM, 0)) << 0;
    bad |= eperm(socket(AF_UNIX, SOCK_STREAM, 0)) << 1;
    int sv[2];
    bad |= eperm(socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) << 2;
    bad |= eperm(kill(getppid(), 0)) << 3;         // signal 0: the check without the signal
    bad |= eperm(kill(-1, 0)) << 4;
    bad |= (kill(getpid(), 0) != 0) << 5;          // itself: allowed
    struct rlimit rl{};
    bad |= (getrlimit(RLIMIT_AS, &rl) != 0) << 6;  // reading a limit stays
    bad |= eperm(setrlimit(RLIMIT_AS, &rl)) << 7;
    bad |= eperm(syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, getppid(), 0, 0)) << 8;
    bad |= eperm(syscall(SYS_io_uring_setup, 1, nullptr)) << 9;
    bad |= eperm(setrlimit(RLIMIT_CPU, &rl)) << 10;
    struct rlimit files{};
    getrlimit(RLIMIT_NOFILE, &files);
    bad |= eperm(prlimit(getppid(), RLIMIT_NOFILE, &files, nullptr)) << 11;   // another process's limit
    return bad;
  };
  EXPECT_SANDBOXED(hostile);
}

// What the CUDA driver does when it starts: raise its own descriptor limit to the hard limit.
TEST(Sandbox, OwnLimitsTheSandboxDoesNotSetMayChange) {
  auto honest = [&] {
    struct rlimit files{};
    if (getrlimit(RLIMIT_NOFILE, &files) != 0) return 1;
    files.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &files) != 0) return 2;
    if (take_sandbox_violation()) return 3;
    return 0;
  };
  EXPECT_SANDBOXED(honest);
}

TEST(Sandbox, LoadingAKernelFromAMemfdStillWorks) {
  auto honest = [&] {
    int fd = memfd_create("kc-test", MFD_CLOEXEC);
    if (fd < 0) return 1;
    if (write(fd, "x", 1) != 1) return 2;
    // dlopen's own open of the name is a read-only one; a non-ELF file fails in the loader, not in the filter.
    std::string path = "/proc/self/fd/" + std::to_string(fd);
    int r = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (r < 0) return 3;
    if (take_sandbox_violation()) return 4;
    return 0;
  };
  EXPECT_SANDBOXED(honest);
}

TEST(Sandbox, CpuLimitEndsASpinner) {
  SandboxPolicy p;   // the limits alone, no filter needed
  p.cpu_seconds = 1;
  auto spin = [] {
    volatile uint64_t x = 0;
    for (;;) x = x + 1;
    return 0;
  };
  const int st = run_child(spin, p);
  ASSERT_TRUE(WIFSIGNALED(st));
  EXPECT_TRUE(WTERMSIG(st) == SIGXCPU || WTERMSIG(st) == SIGKILL) << WTERMSIG(st);
}

TEST(Sandbox, FileSizeLimitEndsAHugeWrite) {
  const std::string f = scratch("huge");
  SandboxPolicy p;
  p.file_bytes = 1 << 20;
  auto writer = [&] {
    int fd = open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);   // before the sandbox's filter: an open descriptor
    if (fd < 0) return 1;
    static char buf[1 << 16];
    for (int i = 0; i < 64; ++i)   // 4 MiB
      if (write(fd, buf, sizeof buf) < 0) return 2;
    return 0;
  };
  const int st = run_child(writer, p);
  ASSERT_TRUE(WIFSIGNALED(st)) << "exit " << WEXITSTATUS(st);
  EXPECT_EQ(WTERMSIG(st), SIGXFSZ);
  struct stat s{};
  ASSERT_EQ(stat(f.c_str(), &s), 0);
  EXPECT_LE(s.st_size, (1 << 20) + (1 << 16));
  unlink(f.c_str());
}

TEST(Sandbox, AddressSpaceCapIsLockedAndNoCoreFiles) {
  SandboxPolicy p;
  p.lock_address_space = true;
  auto probe = [] {
    struct rlimit rl{static_cast<rlim_t>(8) << 30, RLIM_INFINITY};   // a soft cap, as memory_cap.h sets it
    if (setrlimit(RLIMIT_AS, &rl) != 0) return 1;
    if (!apply_sandbox([] { SandboxPolicy q; q.lock_address_space = true; return q; }())) return 2;
    getrlimit(RLIMIT_AS, &rl);
    if (rl.rlim_max != rl.rlim_cur) return 3;
    // Too much: fails instead of growing the process (MAP_NORESERVE: no commit charge would stop it).
    void* m = mmap(nullptr, size_t{16} << 30, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m != MAP_FAILED) return 4;
    getrlimit(RLIMIT_CORE, &rl);
    return rl.rlim_max == 0 ? 0 : 5;
  };
  const int st = run_child(probe, p, /*sandbox=*/false);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << WEXITSTATUS(st);
}

TEST(Sandbox, PolicyPerModeAndBackend) {
  EXPECT_FALSE(sandbox_policy(EvolveSandbox::kOff, false, 10).filter);
  EXPECT_EQ(sandbox_policy(EvolveSandbox::kOff, false, 10).cpu_seconds, 0);
  EXPECT_TRUE(sandbox_policy(EvolveSandbox::kCpu, false, 10).filter);
  EXPECT_TRUE(sandbox_policy(EvolveSandbox::kCpu, false, 10).filter_writes);
  EXPECT_FALSE(sandbox_policy(EvolveSandbox::kCpu, true, 10).filter);     // CUDA: limits only
  EXPECT_EQ(sandbox_policy(EvolveSandbox::kCpu, true, 10).cpu_seconds, 10);
  EXPECT_TRUE(sandbox_policy(EvolveSandbox::kAll, true, 10).filter);
  EXPECT_FALSE(sandbox_policy(EvolveSandbox::kAll, true, 10).filter_writes);  // the driver opens /dev/nvidia*
}

// The sanitizer stage writes each input to a file: a child whose limit is below the largest input
// dies of SIGXFSZ there (it did, for every 256 MiB key on the H200).
TEST(Sandbox, FileLimitAdmitsTheLargestInput) {
  auto small = make_call(OpId::kRelu, {1000}, DType::kF32, BackendKind::kCuda);
  ASSERT_TRUE(small.is_ok());
  EXPECT_EQ(sandbox_file_bytes(small.value()), kSandboxFileBytes);
  auto big = make_call(OpId::kGroupNorm, {16, 64, 256, 256}, DType::kF32, BackendKind::kCuda, {{"group", 8}});
  ASSERT_TRUE(big.is_ok());
  EXPECT_GT(sandbox_file_bytes(big.value()), int64_t{256} << 20);
}

}  // namespace
}  // namespace kc::evolve
