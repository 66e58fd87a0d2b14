"""What runs inside the engine build Job's pod: build.sh (rootless BuildKit image,
busybox sh) and report.py (a plain Python image, standard library only). Both reach the
pod through the Job's ConfigMap; neither imports k3infra."""
