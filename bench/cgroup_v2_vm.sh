#!/bin/sh
# Runs pytest arguments in a VM booted with cgroup v2 alone (memory and pids on v2), as root, for
# a host whose own cgroups are v1 or hybrid (tests/test_cgroup_v2.py skips there). The VM sees the
# host's file tree read-only over 9p (this checkout, its interpreter and packages), with tmpfs for
# /tmp, /run, /dev/shm; QEMU in software emulation (TCG), as nested KVM may hang: ~1 min to boot
# and import, then the tests' own time. Needs root, qemu-system-x86, and apt for Debian's kernel
# and busybox-static (downloaded, not installed, into WORK).
#   sh bench/cgroup_v2_vm.sh tests/test_cgroup_v2.py tests/test_memory_account.py -k "not build"
set -eu
WORK=${CGROUP_V2_VM_DIR:-/var/tmp/magpie-cgroup-v2-vm}
TREE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$WORK/out" && cd "$WORK"
if [ ! -f initrd.gz ]; then
  apt-get download linux-image-amd64 busybox-static >/dev/null
  kernel=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
  apt-get download "$kernel" >/dev/null
  dpkg -x "$kernel"_*.deb k && dpkg -x busybox-static_*.deb bb
  mkdir -p initrd/bin initrd/mods initrd/proc initrd/sys initrd/dev initrd/newroot
  cp bb/bin/busybox initrd/bin/
  MODS="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p"
  for m in $MODS; do cp "$(find k/lib/modules -name "$m.ko*" | head -1)" initrd/mods/; done
  cat > initrd/init <<EOF
#!/bin/busybox sh
B=/bin/busybox
\$B mount -t proc proc /proc; \$B mount -t sysfs sys /sys; \$B mount -t devtmpfs dev /dev
for m in $MODS; do \$B insmod /mods/\$m.ko* || echo "insmod \$m failed"; done
# a tmpfs root with the host's trees bound in: a mount on a 9p folder is lost when it revalidates
\$B mount -t tmpfs -o size=64m tmpfs /newroot; \$B mkdir -p /newroot/host /newroot/out
\$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose host0 /newroot/host
\$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 out /newroot/out
for e in \$(\$B ls /newroot/host); do
  case \$e in proc|sys|dev|tmp|run|host|out) \$B mkdir -p /newroot/\$e; continue;; esac
  if [ -L /newroot/host/\$e ]; then \$B ln -s \$(\$B readlink /newroot/host/\$e) /newroot/\$e
  elif [ -d /newroot/host/\$e ]; then \$B mkdir /newroot/\$e; \$B mount --bind /newroot/host/\$e /newroot/\$e; fi
done
\$B umount /proc /sys /dev
exec \$B switch_root /newroot /bin/sh /out/guest.sh
EOF
  chmod +x initrd/init
  (cd initrd && find . | ../bb/bin/busybox cpio -o -H newc | gzip > ../initrd.gz)
fi
cat > out/guest.sh <<EOF
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/shm; mount -t tmpfs -o mode=1777 tmpfs /dev/shm
for d in /tmp /run /var/tmp; do mount -t tmpfs tmpfs \$d; done
mount -t cgroup2 none /sys/fs/cgroup
export HOME=/tmp PATH="$PATH" PYTHONDONTWRITEBYTECODE=1
echo "cgroup v2 controllers: \$(cat /sys/fs/cgroup/cgroup.controllers)" > /out/log
cd "$TREE" && python -m pytest -q -p no:cacheprovider -o addopts="" $(printf "'%s' " "$@") >> /out/log 2>&1
echo "exit \$?" >> /out/log
echo o > /proc/sysrq-trigger
EOF
rm -f out/log
timeout 1800 qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 6144 -nographic -no-reboot \
  -kernel k/boot/vmlinuz-* -initrd initrd.gz -append "console=ttyS0 quiet panic=-1" \
  -fsdev local,id=r,path=/,security_model=passthrough,readonly=on -device virtio-9p-pci,fsdev=r,mount_tag=host0 \
  -fsdev local,id=o,path="$WORK/out",security_model=passthrough -device virtio-9p-pci,fsdev=o,mount_tag=out \
  > console.log 2>&1 || true
cat out/log
tail -1 out/log | grep -qx "exit 0"
