package client_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shale-db/shale/client"
	"github.com/shale-db/shale/internal/testcluster"
)

// A local 3-node cluster with two shards split at "m" stands in for yours.
func startCluster() ([]string, func()) {
	c, stop := testcluster.StartForExample(testcluster.Options{Splits: [][]byte{[]byte("m")}})
	return c.Endpoints(), stop
}

func Example() {
	endpoints, stop := startCluster()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := client.New(ctx, endpoints)
	if err != nil {
		fmt.Println("connect:", err)
		return
	}
	defer c.Close()

	if _, err := c.Put(ctx, []byte("greeting"), []byte("hello")); err != nil {
		fmt.Println("put:", err)
		return
	}
	kv, err := c.Get(ctx, []byte("greeting"))
	if err != nil {
		fmt.Println("get:", err)
		return
	}
	fmt.Printf("%s = %s (version %d)\n", kv.Key, kv.Value, kv.Version)

	_, err = c.Get(ctx, []byte("absent"))
	fmt.Println("absent key is not found:", errors.Is(err, client.ErrNotFound))
	// Output:
	// greeting = hello (version 1)
	// absent key is not found: true
}

func ExampleClient_Scan() {
	endpoints, stop := startCluster()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, endpoints)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	for _, k := range []string{"apple", "kiwi", "mango", "pear", "zucchini"} {
		if _, err := c.Put(ctx, []byte("fruit/"+k), []byte("1")); err != nil {
			fmt.Println(err)
			return
		}
		if _, err := c.Put(ctx, []byte(k), []byte("1")); err != nil {
			fmt.Println(err)
			return
		}
	}
	// The scan walks both shards ("m" splits them) in order, in reverse here.
	it := c.Scan(ctx, []byte("b"), []byte("q"), client.WithReverse())
	defer it.Close()
	for it.Next() {
		fmt.Println(string(it.KV().Key))
	}
	if err := it.Err(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// pear
	// mango
	// kiwi
	// fruit/zucchini
	// fruit/pear
	// fruit/mango
	// fruit/kiwi
	// fruit/apple
}

func ExampleClient_CompareAndSwap() {
	endpoints, stop := startCluster()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, endpoints)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	// Create the lock only if nobody holds it.
	ok, _, err := c.CompareAndSwap(ctx, []byte("lock"), nil, []byte("owner-1"), client.ExpectAbsent())
	fmt.Println("acquired:", ok, err)
	ok, cur, err := c.CompareAndSwap(ctx, []byte("lock"), nil, []byte("owner-2"), client.ExpectAbsent())
	fmt.Printf("second acquire: %v, held by %s, %v\n", ok, cur.Value, err)
	// Output:
	// acquired: true <nil>
	// second acquire: false, held by owner-1, <nil>
}
