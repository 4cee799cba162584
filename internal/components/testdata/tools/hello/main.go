package main

import "fmt"

var version = "dev"

func main() { fmt.Println("hello", version) }
