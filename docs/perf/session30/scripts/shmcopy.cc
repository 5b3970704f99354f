// Where does a 2 MB copy into / out of a shared-memory region go on this host?
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
static double Now() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static double Med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
int main(int argc, char** argv) {
  const size_t total = (64u << 20) + 64, n = 2u << 20;
  const char* key = "/kplan-shmcopy";
  shm_unlink(key);
  int fd = shm_open(key, O_CREAT | O_RDWR, 0600);
  ftruncate(fd, total);
  char* a = (char*)mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  char* b = (char*)mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  std::vector<char> src(n, 3);
  for (int pin = 0; pin < 2; ++pin) {
    if (pin) { cudaError_t e = cudaHostRegister(b, total, cudaHostRegisterDefault); printf("cudaHostRegister: %s\n", cudaGetErrorString(e)); }
    for (size_t at : {size_t(64), size_t(32u << 20) - n - 64, size_t(64u << 20) - n}) {
      std::vector<double> w, r, rf, wb;
      for (int i = 0; i < 60; ++i) {
        src[i]++;
        double t0 = Now(); memcpy(a + at, src.data(), n); double t1 = Now();
        std::string s(a + at, n); double t2 = Now();
        memcpy(b + at, src.data(), n); double t3 = Now();
        std::vector<char> keep(src); double t4 = Now(); // fresh vector copy
        if (i >= 10) { w.push_back(t1 - t0); rf.push_back(t2 - t1); wb.push_back(t3 - t2); r.push_back(t4 - t3); }
        if (s[5] == 42) printf("x");
      }
      printf("pin %d at %9zu: write A %.1f us, read A into fresh string %.1f, write B %.1f, fresh heap copy %.1f\n", pin, at, Med(w), Med(rf), Med(wb), Med(r));
    }
  }
  // Fresh 2 MB strings as protobuf's set_data makes them.
  std::vector<double> f;
  for (int i = 0; i < 50; ++i) { double t0 = Now(); std::string s(src.data(), n); f.push_back(Now() - t0); if (s[7] == 42) printf("x"); }
  printf("fresh std::string 2 MB copy: %.1f us\n", Med(f));
  system("cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>&1; nproc; lscpu | grep -i 'numa\\|model name'");
  shm_unlink(key);
  return 0;
}
