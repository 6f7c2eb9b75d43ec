"""The thesis' experiments behind `oopscope bench`: IOP vs OOP, disorder."""
