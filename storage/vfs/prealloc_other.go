//go:build !linux

package vfs

import "os"

func preallocate(*os.File, int64, int64) error { return ErrUnsupported }

func syncData(f *os.File) error { return f.Sync() }

func syncDataHeld(f *os.File) error { return f.Sync() }

func startWriteback(*os.File, int64, int64) error { return ErrUnsupported }
