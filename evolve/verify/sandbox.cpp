// The evaluation sandbox (sandbox.h): resource limits, and a seccomp filter built with libseccomp,
// which is dlopen()ed so that a machine without it still evaluates (limits only, one log line).
#include "evolve/verify/sandbox.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <thread>
#include <vector>

#if KC_WITH_SECCOMP
#include <seccomp.h>
#endif

namespace kc::evolve {

nlohmann::json SandboxPolicy::to_json() const {
  return {{"filter", filter}, {"filter_writes", filter && filter_writes}, {"cpu_seconds", cpu_seconds},
          {"file_bytes", file_bytes}, {"no_core", no_core}, {"lock_address_space", lock_address_space}};
}

nlohmann::json SandboxViolation::to_json() const {
  return {{"syscall", name}, {"number", syscall}, {"attempts", attempts}, {"args", {args[0], args[1], args[2]}}};
}

SandboxPolicy sandbox_policy(EvolveSandbox mode, bool cuda, int64_t cpu_seconds) {
  SandboxPolicy p;
  if (mode == EvolveSandbox::kOff) {
    p.no_core = false;
    return p;
  }
  p.filter = !cuda || mode == EvolveSandbox::kAll;
  p.filter_writes = !cuda;
  p.cpu_seconds = cpu_seconds;
  p.file_bytes = kSandboxFileBytes;
  return p;
}

int64_t sandbox_file_bytes(const OpCall& c) {
  int64_t bytes = kSandboxFileBytes;
  for (const TensorMeta& t : c.inputs)
    if (t.defined) bytes = std::max(bytes, t.numel() * dtype_size(t.dtype) + (int64_t{1} << 20));
  return bytes;
}

int64_t sandbox_cpu_seconds(double wall_s) {
  const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int64_t>(std::max(1.0, wall_s) * n) + 1;
}

namespace {

// What the SIGSYS handler saw; written from signal context, so atomics only.
std::atomic<int64_t> g_denied{0};
std::atomic<int> g_first_denied{-1};
std::atomic<uint64_t> g_first_args[3];

Status set_limit(int resource, rlim_t soft, rlim_t hard, const char* name) {
  struct rlimit cur{};
  if (getrlimit(resource, &cur) != 0) return Status::error(Code::kUnavailable, std::string("getrlimit ") + name);
  // Limits only go down: a hard limit already below ours stays.
  if (cur.rlim_max != RLIM_INFINITY) {
    hard = std::min(hard, cur.rlim_max);
    soft = std::min(soft, hard);
  }
  struct rlimit rl{soft, hard};
  if (setrlimit(resource, &rl) != 0)
    return Status::error(Code::kUnavailable, std::string("setrlimit ") + name + ": " + std::strerror(errno));
  return Status::ok();
}

Status apply_limits(const SandboxPolicy& p) {
  if (p.cpu_seconds > 0) {
    struct rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const rlim_t used = static_cast<rlim_t>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1;
    // SIGXCPU at the soft limit (ends the process by default), SIGKILL a few seconds later.
    const rlim_t soft = used + static_cast<rlim_t>(p.cpu_seconds);
    KC_RETURN_IF_ERROR(set_limit(RLIMIT_CPU, soft, soft + 5, "RLIMIT_CPU"));
  }
  if (p.file_bytes > 0) {
    // The limit is on a file's size, not on what is written: when stderr is the worker's log,
    // the child may still append to it.
    struct stat st{};
    rlim_t base = 0;
    if (fstat(2, &st) == 0 && S_ISREG(st.st_mode)) base = static_cast<rlim_t>(st.st_size);
    const rlim_t lim = base + static_cast<rlim_t>(p.file_bytes);
    KC_RETURN_IF_ERROR(set_limit(RLIMIT_FSIZE, lim, lim, "RLIMIT_FSIZE"));
  }
  if (p.no_core) KC_RETURN_IF_ERROR(set_limit(RLIMIT_CORE, 0, 0, "RLIMIT_CORE"));
  if (p.lock_address_space) {
    struct rlimit rl{};
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
      KC_RETURN_IF_ERROR(set_limit(RLIMIT_AS, rl.rlim_cur, rl.rlim_cur, "RLIMIT_AS"));
  }
  return Status::ok();
}

#if KC_WITH_SECCOMP

// libseccomp's entry points, loaded once; the only place that names them.
struct SeccompApi {
  scmp_filter_ctx (*init)(uint32_t);
  void (*release)(scmp_filter_ctx);
  int (*attr_set)(scmp_filter_ctx, enum scmp_filter_attr, uint32_t);
  int (*rule_add_array)(scmp_filter_ctx, uint32_t, int, unsigned int, const struct scmp_arg_cmp*);
  int (*load)(scmp_filter_ctx);
  int (*resolve_name)(const char*);
  char* (*resolve_num_arch)(uint32_t, int);
  Status status;
};

const SeccompApi& seccomp_api() {
  static const SeccompApi api = [] {
    SeccompApi a{};
    void* h = dlopen("libseccomp.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      a.status = Status::error(Code::kUnavailable, std::string("libseccomp.so.2 not loadable: ") + (e ? e : "?"));
      return a;
    }
    auto sym = [&](const char* n) { return dlsym(h, n); };
    a.init = reinterpret_cast<decltype(a.init)>(sym("seccomp_init"));
    a.release = reinterpret_cast<decltype(a.release)>(sym("seccomp_release"));
    a.attr_set = reinterpret_cast<decltype(a.attr_set)>(sym("seccomp_attr_set"));
    a.rule_add_array = reinterpret_cast<decltype(a.rule_add_array)>(sym("seccomp_rule_add_array"));
    a.load = reinterpret_cast<decltype(a.load)>(sym("seccomp_load"));
    a.resolve_name = reinterpret_cast<decltype(a.resolve_name)>(sym("seccomp_syscall_resolve_name"));
    a.resolve_num_arch = reinterpret_cast<decltype(a.resolve_num_arch)>(sym("seccomp_syscall_resolve_num_arch"));
    if (!a.init || !a.release || !a.attr_set || !a.rule_add_array || !a.load || !a.resolve_name || !a.resolve_num_arch)
      a.status = Status::error(Code::kUnavailable, "libseccomp.so.2 lacks an entry point this build uses");
    return a;
  }();
  return api;
}

// A denied call returns -EPERM as if the kernel had said so, and is counted for the gauntlet.
#if defined(__x86_64__) || defined(__aarch64__)
constexpr bool kCanTrap = true;
void on_sigsys(int, siginfo_t* si, void* uc_void) {
  auto* uc = static_cast<ucontext_t*>(uc_void);
#if defined(__x86_64__)
  const uint64_t args[3] = {static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RDI]),
                            static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RSI]),
                            static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RDX])};
  uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
#else
  const uint64_t args[3] = {uc->uc_mcontext.regs[0], uc->uc_mcontext.regs[1], uc->uc_mcontext.regs[2]};
  uc->uc_mcontext.regs[0] = static_cast<unsigned long long>(-EPERM);
#endif
  int none = -1;
  if (g_first_denied.compare_exchange_strong(none, si->si_syscall))
    for (int i = 0; i < 3; ++i) g_first_args[i].store(args[i]);   // evidence: which limit, which flags
  g_denied.fetch_add(1);
}
#else
constexpr bool kCanTrap = false;   // elsewhere: plain EPERM, not recorded
void on_sigsys(int, siginfo_t*, void*) {}
#endif

scmp_arg_cmp arg(unsigned idx, scmp_compare op, uint64_t a, uint64_t b = 0) { return scmp_arg_cmp{idx, op, a, b}; }
scmp_arg_cmp has_bits(unsigned idx, uint64_t bits) { return arg(idx, SCMP_CMP_MASKED_EQ, bits, bits); }

// Adds the rules; `deny` is the action of a violation.
class FilterBuilder {
 public:
  FilterBuilder(const SeccompApi& s, scmp_filter_ctx ctx, uint32_t deny) : s_(s), ctx_(ctx), deny_(deny) {}

  // One rule: `name` with all of `args` matching. A call this libseccomp or architecture does
  // not know (open on aarch64, a newer kernel's call) has nothing to filter.
  void rule(const char* name, std::initializer_list<scmp_arg_cmp> args = {}, uint32_t action = 0) {
    const int nr = s_.resolve_name(name);
    if (nr < 0) return;
    std::vector<scmp_arg_cmp> a(args);
    const int rc = s_.rule_add_array(ctx_, action ? action : deny_, nr, a.size(), a.data());
    if (rc != 0 && status_.is_ok())
      status_ = Status::error(Code::kUnavailable, std::string("seccomp rule for ") + name + ": " + std::strerror(-rc));
  }
  void rules(std::initializer_list<const char*> names) {
    for (const char* n : names) rule(n);
  }
  const Status& status() const { return status_; }

 private:
  const SeccompApi& s_;
  scmp_filter_ctx ctx_;
  uint32_t deny_;
  Status status_;
};

void add_process_rules(FilterBuilder& f) {
  const uint64_t self = static_cast<uint64_t>(getpid());
  f.rules({"fork", "vfork", "execve", "execveat", "unshare", "setns", "setsid", "setpgid", "ptrace",
           "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "tkill"});
  // clone's flags are its first argument on x86-64 and aarch64: a thread, and nothing else.
  f.rule("clone", {arg(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0)});
  for (uint64_t ns : {CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP})
    f.rule("clone", {has_bits(0, ns)});
  // clone3 passes its flags in memory, which a filter cannot read: ENOSYS, and glibc uses clone.
  f.rule("clone3", {}, SCMP_ACT_ERRNO(ENOSYS));
  // Signals to this process only (never the worker, the broker or anyone else of this user).
  f.rule("kill", {arg(0, SCMP_CMP_NE, self)});
  f.rule("tgkill", {arg(0, SCMP_CMP_NE, self)});
  f.rule("rt_sigqueueinfo", {arg(0, SCMP_CMP_NE, self)});
  f.rule("rt_tgsigqueueinfo", {arg(0, SCMP_CMP_NE, self)});
}

void add_limit_and_kernel_rules(FilterBuilder& f) {
  // The limits the sandbox sets may not change; others (the CUDA driver raises RLIMIT_NOFILE's soft
  // limit when it starts) may, for this process only. Reading any limit (new == NULL) stays.
  for (uint64_t r : {RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_CORE, RLIMIT_AS}) {
    f.rule("setrlimit", {arg(0, SCMP_CMP_EQ, r)});
    f.rule("prlimit64", {arg(1, SCMP_CMP_EQ, r), arg(2, SCMP_CMP_NE, 0)});
  }
  f.rule("prlimit64", {arg(0, SCMP_CMP_NE, 0), arg(2, SCMP_CMP_NE, 0)});   // another process's limits
  // Kernel facilities no kernel evaluation needs; io_uring would open files past the filter, SysV
  // IPC objects and message queues outlive the process, keys and modules are not ours to touch.
  f.rules({"io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open", "userfaultfd",
           "keyctl", "add_key", "request_key", "shmget", "semget", "msgget", "mq_open", "mq_unlink", "mount",
           "umount2", "pivot_root", "chroot", "fsopen", "fsmount", "fsconfig", "fspick", "open_tree", "move_mount",
           "mount_setattr", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
           "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "memfd_secret"});
  // A terminal on stderr (`kernelcraft verify` run by hand) must not receive typed-in input.
  f.rule("ioctl", {arg(1, SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI)});
  f.rule("ioctl", {arg(1, SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCLINUX)});
}

void add_network_rules(FilterBuilder& f, bool keep_unix) {
  if (keep_unix) {
    f.rule("socket", {arg(0, SCMP_CMP_NE, AF_UNIX)});
    return;
  }
  f.rules({"socket", "socketpair", "connect", "bind", "listen", "accept", "accept4"});
}

void add_write_rules(FilterBuilder& f) {
  // open's flags: any of these make it a write (O_CREAT alone creates a file).
  for (uint64_t bit : {uint64_t{O_WRONLY}, uint64_t{O_RDWR}, uint64_t{O_CREAT}, uint64_t{O_TRUNC}}) {
    f.rule("open", {has_bits(1, bit)});
    f.rule("openat", {has_bits(2, bit)});
  }
  // openat2 keeps its flags in memory; nothing in an evaluation uses it.
  f.rules({"creat", "openat2", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2",
           "link", "linkat", "symlink", "symlinkat", "mknod", "mknodat", "chmod", "fchmod", "fchmodat", "fchmodat2",
           "chown", "fchown", "lchown", "fchownat", "truncate", "ftruncate", "fallocate", "utime", "utimes",
           "utimensat", "futimesat", "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr",
           "fremovexattr", "name_to_handle_at", "open_by_handle_at"});
}

Status install_filter(const SandboxPolicy& p) {
  const SeccompApi& s = seccomp_api();
  if (!s.status) return s.status;
  uint32_t deny = SCMP_ACT_ERRNO(EPERM);
  if (kCanTrap) {
    struct sigaction sa{};
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSYS, &sa, nullptr) == 0) deny = SCMP_ACT_TRAP;
  }
  scmp_filter_ctx ctx = s.init(SCMP_ACT_ALLOW);
  if (!ctx) return Status::error(Code::kUnavailable, "seccomp_init failed");
  struct Release {
    const SeccompApi& s;
    scmp_filter_ctx c;
    ~Release() { s.release(c); }
  } release{s, ctx};
  // Every thread (at::parallel_for's pool runs the kernel), no privileges gained by anything later.
  if (s.attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1) != 0 || s.attr_set(ctx, SCMP_FLTATR_CTL_NNP, 1) != 0)
    return Status::error(Code::kUnavailable, "seccomp: cannot ask for thread sync / no_new_privs");
  FilterBuilder f(s, ctx, deny);
  add_process_rules(f);
  add_limit_and_kernel_rules(f);
  add_network_rules(f, !p.filter_writes);
  if (p.filter_writes) add_write_rules(f);
  KC_RETURN_IF_ERROR(f.status());
  if (int rc = s.load(ctx); rc != 0)
    return Status::error(Code::kUnavailable, std::string("seccomp_load: ") + std::strerror(-rc));
  return Status::ok();
}

std::string syscall_name(int nr) {
  const SeccompApi& s = seccomp_api();
  if (s.status) {
    if (char* n = s.resolve_num_arch(SCMP_ARCH_NATIVE, nr)) {
      std::string out = n;
      std::free(n);
      return out;
    }
  }
  return "syscall " + std::to_string(nr);
}

#else  // built without libseccomp's header

Status install_filter(const SandboxPolicy&) {
  return Status::error(Code::kUnavailable, "built without libseccomp (seccomp.h not found at configure time)");
}
std::string syscall_name(int nr) { return "syscall " + std::to_string(nr); }

#endif

}  // namespace

Status apply_sandbox(const SandboxPolicy& p) {
  KC_RETURN_IF_ERROR(apply_limits(p));
  if (!p.filter) return Status::ok();
  return install_filter(p);
}

std::optional<SandboxViolation> take_sandbox_violation() {
  const int64_t n = g_denied.exchange(0);
  const int first = g_first_denied.exchange(-1);
  if (n == 0) return std::nullopt;
  SandboxViolation v;
  v.syscall = first;
  v.name = syscall_name(first);
  v.attempts = n;
  for (int i = 0; i < 3; ++i) v.args[i] = g_first_args[i].load();
  return v;
}

}  // namespace kc::evolve
