package replication

import (
	"context"
	"fmt"
	"log/slog"
	"os"
)

// raftLogger adapts slog to raft.Logger. Raft's Info level is chatty
// (every election step); it is logged at Debug except for the lines raft
// marks as warnings and errors.
type raftLogger struct {
	l *slog.Logger
}

func (r raftLogger) log(level slog.Level, msg string) {
	r.l.Log(context.Background(), level, msg)
}

func (r raftLogger) Debug(v ...any) { r.log(slog.LevelDebug-4, fmt.Sprint(v...)) }
func (r raftLogger) Debugf(format string, v ...any) {
	r.log(slog.LevelDebug-4, fmt.Sprintf(format, v...))
}
func (r raftLogger) Info(v ...any)                 { r.log(slog.LevelDebug, fmt.Sprint(v...)) }
func (r raftLogger) Infof(format string, v ...any) { r.log(slog.LevelDebug, fmt.Sprintf(format, v...)) }
func (r raftLogger) Warning(v ...any)              { r.log(slog.LevelWarn, fmt.Sprint(v...)) }
func (r raftLogger) Warningf(format string, v ...any) {
	r.log(slog.LevelWarn, fmt.Sprintf(format, v...))
}
func (r raftLogger) Error(v ...any) { r.log(slog.LevelError, fmt.Sprint(v...)) }
func (r raftLogger) Errorf(format string, v ...any) {
	r.log(slog.LevelError, fmt.Sprintf(format, v...))
}
func (r raftLogger) Fatal(v ...any) {
	r.log(slog.LevelError, fmt.Sprint(v...))
	os.Exit(1)
}
func (r raftLogger) Fatalf(format string, v ...any) {
	r.log(slog.LevelError, fmt.Sprintf(format, v...))
	os.Exit(1)
}

// Panic and Panicf are raft's invariant failures (a corrupted log or a bug);
// raft expects them not to return.
func (r raftLogger) Panic(v ...any) {
	s := fmt.Sprint(v...)
	r.log(slog.LevelError, s)
	panic(s) // invariant: raft's own assertion failed
}
func (r raftLogger) Panicf(format string, v ...any) {
	s := fmt.Sprintf(format, v...)
	r.log(slog.LevelError, s)
	panic(s) // invariant: raft's own assertion failed
}
